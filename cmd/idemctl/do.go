package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/idemkit/idempotency/server"
)

// do runs the command against in.
func (c *command) do(ctx context.Context, in server.Inspector, env environment) error {
	switch c.name {
	case "lookup":
		r, err := in.Lookup(ctx, c.id)
		if err != nil {
			return err
		}
		if c.json {
			return writeJSON(env.stdout, r, env.now())
		}
		writeText(env.stdout, r, env.now())
		return nil
	case "resolve":
		before, err := in.Lookup(ctx, c.id)
		if err != nil {
			return err
		}
		if err := in.Resolve(ctx, c.id, c.resp, c.ttl); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "resolved: key %q in scope %q, %s before, is recorded as done with %d %s (%d body bytes); every retry gets it for %v\n",
			c.id.Key, c.id.Scope, stateOf(before), c.resp.Status, http.StatusText(c.resp.Status), len(c.resp.Body), c.ttl)
		if !before.Completed {
			fmt.Fprintln(env.stdout, "its holder, if still running, can no longer complete it")
		}
		return nil
	default: // forget
		before, err := in.Lookup(ctx, c.id)
		if err != nil {
			return err
		}
		if err := in.Resolve(ctx, c.id, nil, 0); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "forgotten: key %q in scope %q, %s before; the next request with it runs\n", c.id.Key, c.id.Scope, stateOf(before))
		if !before.Completed {
			fmt.Fprintln(env.stdout, "its holder, if still running, can no longer complete it")
		}
		return nil
	}
}
