package redisstore

import "github.com/idemkit/idempotency/engine"

// StepsKey returns the key that holds id's steps, for the tests of its slot
// and its expiry.
func (s *Store) StepsKey(id engine.ID) string { return stepsKey(s.prefix, s.RecordKey(id)) }

// LibraryName returns the name of the Store's function library.
func (s *Store) LibraryName() string { return s.lib.name }
