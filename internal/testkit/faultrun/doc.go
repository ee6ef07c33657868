// Package faultrun runs the module's client and middleware together through
// the faults that real networks and stores produce, and reports what came of
// it: how many times each operation took effect, how many were lost, what
// the client and the server saw, and how many requests each operation cost.
//
// Run places orders through a lossy proxy (internal/testkit/faultnet) in front of an
// API behind the middleware, with windows during which the network is a
// black hole or the store is cut or slow. History records concurrent
// requests over a few shared keys and checks them against a sequential
// specification of the protocol (Model) with a linearizability checker.
// Storm measures what a client's retry budget does to an outage.
//
// Every random choice comes from a seed, so that a run can be repeated. The
// runs use loopback addresses only. The tests in internal/tests/e2e call them,
// briefly in CI and at full size behind a flag; RELIABILITY.md reports the
// figures.
package faultrun
