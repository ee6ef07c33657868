// Package sentinel holds the engine's error values that packages the engine
// imports must wrap too (internal/steps). The engine exports each of them
// under its own name (engine.ErrKeyMismatch, engine.ErrResultOmitted),
// where their documentation is.
package sentinel

import "errors"

var (
	// ErrKeyMismatch is engine.ErrKeyMismatch.
	ErrKeyMismatch = errors.New("idempotency key reused for a different request")
	// ErrResultOmitted is engine.ErrResultOmitted.
	ErrResultOmitted = errors.New("the work ran, but its result was not stored")
)
