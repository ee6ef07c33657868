// Package engine runs the idempotency protocol, whatever carries the
// request: one execution per key, under a lease that is renewed while the
// work runs and fenced by a token, the result stored for the retries to
// replay or the key released for them to run again, a takeover that says
// how many holders were lost before it, and a result stored after it was
// answered when the store is slow.
//
// The engine does not import net/http. A door adapts it to a protocol: the
// HTTP middleware in package server, the function door in package once,
// the gRPC interceptors in module idemgrpc. A door gives the engine a
// [Door] for each call, and [Engine.Do] decides, through it, what the call
// gets: a replay, a refusal, or one execution.
//
// The [Store] interface, its records and its errors are defined here, so
// that a store (memstore, pgstore, redisstore, sqlitestore, mysqlstore)
// serves every door. A [StepStore] also keeps the steps of a call, which
// package step runs inside any door's work: the engine hands them to the
// work with the lease, and a takeover or a retry after a release resumes
// after the steps that finished.
package engine
