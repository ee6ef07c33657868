package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/server"
)

// panicCase is one callback that panics while the key is held.
type panicCase struct {
	name string
	// opts builds the options around a function that panics the
	// first time it is called; it may change cfg, the engine's
	// configuration, whose Logger is the test's.
	opts func(panicOnce func(), cfg *engine.Config) []server.Option
	// handler, if set, replaces the ordinary order handler.
	handler func(o *orders) http.Handler
	// abandoned makes the first acquiring Claim a takeover.
	abandoned bool
	// first and retry are the statuses wanted.
	first, retry int
	runs         int64
	logged       string
}

// TestCallbackPanicLeavesNothingClaimed: a user's function that panics while
// the request holds its key must not leave the key claimed until its lease
// ends (a retry would get 409 for a minute, and under RefuseAbandoned the
// final answer would never be recorded). Each case panics on the first
// call only; the retry must get the stored answer, and the handler must
// have run at most once. On every kind of store.
func TestCallbackPanicLeavesNothingClaimed(t *testing.T) {
	tests := []panicCase{
		{
			name: "WithKeep",
			opts: func(panicOnce func(), cfg *engine.Config) []server.Option {
				return []server.Option{server.WithKeep(func(status int) bool {
					panicOnce()
					return server.DefaultKeep(status)
				})}
			},
			first: http.StatusCreated, retry: http.StatusCreated, runs: 1,
			logged: "keep function panicked",
		},
		{
			name: "WithErrorWriter under RefuseAbandoned",
			opts: func(panicOnce func(), cfg *engine.Config) []server.Option {
				cfg.Abandoned = engine.RefuseAbandoned
				return []server.Option{
					server.WithErrorWriter(func(w http.ResponseWriter, r *http.Request, err error) {
						if errors.Is(err, engine.ErrOutcomeUnknown) {
							panicOnce()
						}
						server.WriteProblem(w, r, err)
					}),
				}
			},
			abandoned: true,
			first:     http.StatusConflict, retry: http.StatusConflict, runs: 0,
			logged: "error writer panicked",
		},
		{
			name: "a log handler, on a streamed response",
			opts: func(panicOnce func(), cfg *engine.Config) []server.Option {
				cfg.Logger = slog.New(panicHandler{panicOnce})
				return nil
			},
			handler: func(o *orders) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					o.executions.Add(1)
					w.WriteHeader(http.StatusCreated)
					w.Write([]byte("streamed"))
					w.(http.Flusher).Flush()
				})
			},
			first: http.StatusCreated, retry: http.StatusCreated, runs: 1,
		},
	}
	for _, kind := range teststores.All() {
		for _, tt := range tests {
			t.Run(kind.Name+"/"+tt.name, func(t *testing.T) {
				testCallbackPanic(t, kind, tt)
			})
		}
	}
}

func testCallbackPanic(t *testing.T, kind teststores.Kind, tt panicCase) {
	t.Helper()
	var panicked atomic.Bool
	panicOnce := func() {
		if !panicked.Swap(true) {
			panic("callback bug")
		}
	}
	var logs syncBuffer
	cfg := engine.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	extra := tt.opts(panicOnce, &cfg)
	opts := append([]server.Option{server.WithConfig(cfg)}, extra...)
	store := kind.New(t)
	if tt.abandoned {
		store = &abandoning{Store: store, abandoned: 1}
	}
	o := &orders{}
	var h http.Handler = o
	if tt.handler != nil {
		h = tt.handler(o)
	}
	srv := fixtureWith(t, store, h, opts...)

	first := recv(t, postAsync(srv.URL, "k", "x"), "the first answer")
	require.True(t, panicked.Load(), "the callback was called, and panicked")
	assert.Equal(t, tt.first, first.status, "first answer: %s", first.body)
	retry := post(t, srv.URL, "k", "x")
	assert.Equal(t, tt.retry, retry.status, "retry: %s", retry.body)
	assert.Equal(t, "true", retry.header.Get("Idempotent-Replayed"), "the retry is a replay, not a 409 for a key left claimed")
	assert.Equal(t, tt.runs, o.executions.Load(), "handler runs")
	if tt.logged != "" {
		assert.Equal(t, 1, strings.Count(logs.String(), tt.logged), "logged once: %s", logs.String())
	}
}

// panicHandler is a slog.Handler whose Handle calls panicOnce.
type panicHandler struct{ panicOnce func() }

func (panicHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h panicHandler) Handle(context.Context, slog.Record) error {
	h.panicOnce()
	return nil
}

func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panicHandler) WithGroup(string) slog.Handler      { return h }

// TestErrorWriterPanicStillEnds: a request that held its key and is refused
// with 503 after releasing it (its handler gave up when its lease ended
// unrenewed) still yields its final event, Acquired set, when the
// ErrorWriter panics: an observer that counts the claims in flight from
// EventAcquired would otherwise count this one for ever.
func TestErrorWriterPanicStillEnds(t *testing.T) {
	store, _ := faulty(t)
	store.Set(faultstore.Extend, faultstore.Fault{Err: errFlaky})
	var ev events
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := fixtureWith(t, store, h, server.WithConfig(engine.Config{Lease: 200 * time.Millisecond, Observer: ev.observe, Logger: discardLogger()}),
		server.WithErrorWriter(func(http.ResponseWriter, *http.Request, error) { panic("error writer bug") }))
	got := recv(t, postAsync(srv.URL, "k", "x"), "the answer")
	assert.Equal(t, -1, got.status, "net/http ends the exchange: %s", got.body)
	final := ev.last(t)
	assert.Equal(t, engine.EventUnavailable, final.Kind)
	assert.True(t, final.Acquired)
}
