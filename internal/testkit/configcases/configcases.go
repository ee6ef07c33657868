// Package configcases lists engine configurations, valid and invalid, that
// every door's tests give to its WithConfig, so that each door is held to
// the same rule: a zero field is the engine's default, and an invalid
// configuration is refused with engine.New's own message after the door's
// prefix.
package configcases

import (
	"time"

	"github.com/idemkit/idempotency/engine"
)

// Case is one configuration, named for a subtest.
type Case struct {
	Name   string
	Config engine.Config
}

// All returns the cases: the zero Config first, then one invalid field at a
// time, then every field invalid at once.
func All() []Case {
	return []Case{
		{"zero: the defaults", engine.Config{}},
		{"negative TTL", engine.Config{TTL: -time.Second}},
		{"TTL under the shortest lease", engine.Config{TTL: engine.MinLease - 1}},
		{"negative lease", engine.Config{Lease: -1}},
		{"lease over the TTL", engine.Config{TTL: time.Second, Lease: 2 * time.Second}},
		{"negative store timeout", engine.Config{StoreTimeout: -1}},
		{"negative wait", engine.Config{Wait: -1}},
		{"negative Retry-After", engine.Config{RetryAfter: -1}},
		{"unknown abandoned policy", engine.Config{Abandoned: 7}},
		{"every field invalid", engine.Config{TTL: -1, StoreTimeout: -1, Wait: -1, RetryAfter: -1, Abandoned: -1}},
	}
}
