package redisstore

import "github.com/idemkit/idempotency/engine"

// StepsKey returns the key that holds id's steps in s, for the tests of its
// slot and its expiry.
func StepsKey(s Store, id engine.ID) string {
	st := s.(*store)
	return stepsKey(st.prefix, st.RecordKey(id))
}

// LibraryName returns the name of s's function library.
func LibraryName(s Store) string { return s.(*store).lib.name }
