package idemotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/idemotel"
)

// TestServerGRPCStatus: GRPCServerObserver reads an event's Status as a
// gRPC code: recorded by name as rpc.response.status_code, never as an HTTP
// status; the server errors of the gRPC conventions set error.type and the
// span's status; and a call without an answer gets no status, not OK.
func TestServerGRPCStatus(t *testing.T) {
	tm := newTelemetry(t)
	observe, err := idemotel.GRPCServerObserver(tm.options()...)
	require.NoError(t, err)
	ctx := context.Background()
	at := time.Now()
	for _, e := range []engine.Event{
		{Kind: engine.EventExecuted, Status: 0},     // OK
		{Kind: engine.EventReplayed, Status: 6},     // ALREADY_EXISTS, a stored error
		{Kind: engine.EventInFlight, Status: 10},    // ABORTED
		{Kind: engine.EventUnavailable, Status: 14}, // UNAVAILABLE
		{Kind: engine.EventClientGone, Status: 0},   // no answer
		{Kind: engine.EventReleased, Status: 0},     // a panic: no answer
	} {
		e.Start = at
		observe(ctx, e)
	}
	requests := tm.collect(t)["idempotency.server.requests"]
	status := attribute.Key("rpc.response.status_code")
	errType := attribute.Key("error.type")
	outcome := attribute.Key("idempotency.outcome")
	assert.Equal(t, int64(1), sum(t, requests, outcome.String("executed"), status.String("OK")))
	assert.Equal(t, int64(1), sum(t, requests, outcome.String("replayed"), status.String("ALREADY_EXISTS")))
	assert.Equal(t, int64(1), sum(t, requests, outcome.String("in_flight"), status.String("ABORTED")))
	assert.Equal(t, int64(1), sum(t, requests, outcome.String("unavailable"), status.String("UNAVAILABLE"), errType.String("UNAVAILABLE")))
	assert.Equal(t, int64(0), sum(t, requests, outcome.String("client_gone"), status.String("OK")), "no answer is not OK")
	assert.Equal(t, int64(0), sum(t, requests, outcome.String("released"), status.String("OK")), "a panic is not OK")
	assert.Equal(t, int64(0), sum(t, requests, attribute.Key("http.response.status_code").Int(14)))
	assert.Equal(t, int64(0), sum(t, requests, errType.String("ABORTED")), "ABORTED is not a server error")

	errored := map[string]bool{}
	for _, s := range tm.spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == outcome {
				errored[kv.Value.AsString()] = s.Status().Code == codes.Error
			}
		}
	}
	assert.Equal(t, map[string]bool{"executed": false, "replayed": false, "in_flight": false, "unavailable": true, "client_gone": false, "released": false}, errored)
}
