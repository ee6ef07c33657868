package server

import (
	"context"

	"github.com/idemkit/idempotency/engine"
)

// The Store interface, its records and its errors are package engine's,
// which runs the protocol for every door: a store written for the
// middleware serves the function door and the gRPC interceptors too. These
// aliases keep them at hand here; the documentation is engine's.
type (
	// ID addresses one idempotency record: [engine.ID].
	ID = engine.ID
	// Token is a fencing token: [engine.Token].
	Token = engine.Token
	// ClaimStatus says what a Claim found: [engine.ClaimStatus].
	ClaimStatus = engine.ClaimStatus
	// Claim is the answer of Store.Claim: [engine.Claim].
	Claim = engine.Claim
	// Response is a stored response: [engine.Response]. Its Header is a
	// plain map in http.Header's shape; convert it with http.Header(h)
	// for http.Header's methods.
	Response = engine.Response
	// Store keeps idempotency records: [engine.Store].
	Store = engine.Store
	// Binder is a Store whose lease carries state the handler needs:
	// [engine.Binder].
	Binder = engine.Binder
	// Record is what Inspector.Lookup reports: [engine.Record].
	Record = engine.Record
	// Inspector looks records up and settles them: [engine.Inspector].
	Inspector = engine.Inspector
	// Lease describes the lease a protected handler runs under:
	// [engine.Lease].
	Lease = engine.Lease
)

// The statuses of a Claim.
const (
	Acquired  = engine.Acquired
	InFlight  = engine.InFlight
	Completed = engine.Completed
)

// The Store's errors: [engine.ErrNotStorable], [engine.ErrStoreClosed],
// [engine.ErrNotFound], [engine.ErrNotCommitted], [engine.ErrLeaseLost].
var (
	ErrNotStorable  = engine.ErrNotStorable
	ErrStoreClosed  = engine.ErrStoreClosed
	ErrNotFound     = engine.ErrNotFound
	ErrNotCommitted = engine.ErrNotCommitted
	ErrLeaseLost    = engine.ErrLeaseLost
)

// LeaseFromContext returns the lease of the request being handled, if the
// middleware protects it: [engine.LeaseFromContext]. The handler's context
// is cancelled when the lease is lost or ends without renewal;
// context.Cause then wraps ErrLeaseLost.
func LeaseFromContext(ctx context.Context) (Lease, bool) { return engine.LeaseFromContext(ctx) }
