package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// do runs the command against in.
func (c *command) do(ctx context.Context, in engine.Inspector, env environment) error {
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
		before, err := c.settleable(ctx, in, env.now())
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
		before, err := c.settleable(ctx, in, env.now())
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

// errLive is returned when resolve or forget would settle a key whose holder
// may still be running.
var errLive = errors.New("the holder's lease is live")

// settleable looks the record up, and refuses one in flight under a live
// lease unless -force was given: its holder may be about to do its effect,
// so that forgetting the key would let a retry do it a second time, and
// recording it as done could record what never happens.
func (c *command) settleable(ctx context.Context, in engine.Inspector, now time.Time) (engine.Record, error) {
	r, err := in.Lookup(ctx, c.id)
	if err != nil || r.Completed || c.force || !r.LeaseEnds.After(now) {
		return r, err
	}
	return r, fmt.Errorf("%w: key %q in scope %q is in flight until %s: its holder may still be running. "+
		"Wait for its lease to end, or pass -force to %s it anyway", errLive, c.id.Key, c.id.Scope, when(r.LeaseEnds, now), c.name)
}
