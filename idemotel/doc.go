// Package idemotel turns the events of package server's middleware and of
// the idempotency Client into OpenTelemetry metrics and spans. It uses only
// the OpenTelemetry API: the program picks the SDK and the exporters, and
// passes their providers (or sets the global ones).
//
//	observe, err := idemotel.ServerObserver(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp))
//	mw, err := server.New(store, server.WithConfig(engine.Config{Observer: observe}))
//
//	observeClient, err := idemotel.ClientObserver(idemotel.WithMeterProvider(mp))
//	client, err := idempotency.NewClient(idempotency.WithObserver(observeClient))
//
//	reg, err := idemotel.RegisterStoreSize(func(context.Context) (int64, int64, error) {
//		return int64(memStore.Len()), memStore.Bytes(), nil
//	}, idemotel.WithMeterProvider(mp))
//
// # Metrics
//
// The middleware: idempotency.server.requests counts the protected requests
// by idempotency.outcome (executed, replayed, in_flight, mismatch, rejected,
// unavailable, outcome_unknown, released, not_stored, unprotected,
// client_gone), http.response.status_code and error.type (the status, for a
// 5xx);
// idempotency.server.active_claims counts the keys claimed by requests still
// running; idempotency.server.store.duration and
// idempotency.server.handler.duration measure the store operations (by
// idempotency.store.operation: claim, complete, release, extend; error.type
// when one failed) and the handler; idempotency.server.lease.renewals and
// idempotency.server.lease.losses count what happened to leases.
//
// The client: idempotency.client.attempts and
// idempotency.client.attempt.duration, by http.request.method,
// http.response.status_code and error.type (the status for a 4xx or 5xx,
// else timeout, transport_error or canceled); idempotency.client.retries by
// the error.type that caused them; idempotency.client.operations,
// idempotency.client.operation.attempts and
// idempotency.client.operation.duration, by idempotency.outcome (completed,
// replayed, gave_up, failed, canceled) and, for gave_up,
// idempotency.stop_reason; and the gauge
// idempotency.client.retry_budget.available.
//
// A store: the observable gauges idempotency.store.records and
// idempotency.store.size, read when the metrics are collected.
//
// Durations are in seconds. The README of this module has the full table.
// Metric attributes take few values: neither keys nor scopes go on metrics.
//
// # Spans
//
// The middleware's observer makes, for each request, a span
// idempotency.request, child of the span in the request's context (the
// server span of otelhttp, for example), with a child for each step:
// idempotency.claim, idempotency.handler, then idempotency.complete or
// idempotency.release. They are made after the fact from the event's start
// and durations, so they cost nothing while the request runs. Lease renewals
// and losses are events on the span in the request's context.
//
// The client's observer makes, for each operation, a span
// idempotency.operation, child of the span in the request's context, with a
// child idempotency.attempt for each attempt, made as each attempt ends.
//
// Keys go neither on metrics nor on spans: a key may say more about the
// operation than a trace should (a handler that wants its key on its own
// span reads it from engine.LeaseFromContext). Error messages are never
// recorded, since a store's may name a key: spans and measurements carry
// error.type.
//
// # Attributes
//
// The package's own attributes are idempotency.outcome (what the middleware
// or the client did: the name of an engine.EventKind or an
// idempotency.EventKind), idempotency.store.operation (claim, complete,
// release, extend), idempotency.stop_reason (why a client stopped retrying:
// attempts_exhausted, budget_exhausted, deadline, not_idempotent,
// body_not_replayable, retry_refused; or the server's final answer:
// outcome_unknown, key_mismatch) and, on a client's spans,
// idempotency.attempts, idempotency.replayed and idempotency.retry.wait (the
// wait before the next attempt, in seconds); the others are OpenTelemetry's
// semantic conventions. The meters and tracers are those of the
// instrumentation scope github.com/idemkit/idempotency/idemotel.
//
// # Versions
//
// This is a module of its own, so that the library's go.mod requires no
// OpenTelemetry package; it requires the library's matching release.
package idemotel
