package consume_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
)

// fakeMsg is a delivered message, for the tests that need no engine.
type fakeMsg struct {
	jetstream.Msg // nil: the methods not overridden panic
	md            jetstream.MsgMetadata
	hdr           nats.Header
	data          []byte
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return &m.md, nil }
func (m *fakeMsg) Headers() nats.Header                      { return m.hdr }
func (m *fakeMsg) Data() []byte                              { return m.data }

func newMsg(msgID string, seq uint64) *fakeMsg {
	m := &fakeMsg{
		md:   jetstream.MsgMetadata{Stream: "ORDERS", Consumer: "billing", NumDelivered: 1},
		hdr:  nats.Header{},
		data: []byte(`{"order":1}`),
	}
	m.md.Sequence.Stream = seq
	if msgID != "" {
		m.hdr.Set(jetstream.MsgIDHeader, msgID)
	}
	return m
}

func TestID(t *testing.T) {
	id, err := consume.ID(newMsg("order-1", 7))
	if err != nil {
		t.Fatal(err)
	}
	if want := (engine.ID{Scope: "ORDERS/billing", Key: "order-1"}); id != want {
		t.Errorf("ID() = %+v, want %+v", id, want)
	}
	if _, err := consume.ID(newMsg("", 7)); !errors.Is(err, consume.ErrNoMsgID) {
		t.Errorf("ID() without Nats-Msg-Id: err = %v, want ErrNoMsgID", err)
	}
}

func TestHandlerID(t *testing.T) {
	nop := func(context.Context, engine.ID, []byte) error { return nil }
	for _, tc := range []struct {
		name  string
		opts  []consume.Option
		msg   *fakeMsg
		want  engine.ID
		noKey bool
	}{
		{"msg id", nil, newMsg("order-1", 7), engine.ID{Scope: "ORDERS/billing", Key: "order-1"}, false},
		{"scope", []consume.Option{consume.WithScope("billing-v2")}, newMsg("order-1", 7), engine.ID{Scope: "billing-v2", Key: "order-1"}, false},
		{"no msg id", nil, newMsg("", 7), engine.ID{}, true},
		{"sequence key", []consume.Option{consume.WithSequenceKey()}, newMsg("", 7), engine.ID{Scope: "ORDERS/billing", Key: "seq:7"}, false},
		{"msg id wins over sequence", []consume.Option{consume.WithSequenceKey()}, newMsg("order-1", 7), engine.ID{Scope: "ORDERS/billing", Key: "order-1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := consume.New(nop, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			id, err := h.ID(tc.msg)
			if tc.noKey {
				if !errors.Is(err, consume.ErrNoMsgID) {
					t.Errorf("ID() err = %v, want ErrNoMsgID", err)
				}
				if d := h.Process(context.Background(), tc.msg); d.Action != consume.Term {
					t.Errorf("Process() = %v, want term", d.Action)
				}
				return
			}
			if err != nil || id != tc.want {
				t.Errorf("ID() = %+v, %v, want %+v", id, err, tc.want)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	permanent := errors.New("card declined")
	h, err := consume.New(func(context.Context, engine.ID, []byte) error { return nil },
		consume.WithRetryDelay(time.Second),
		consume.WithFinal(func(err error) bool { return errors.Is(err, permanent) }))
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		err    error
		action consume.Action
		delay  time.Duration
	}{
		{"done", context.Background(), nil, consume.Ack, 0},
		{"released", context.Background(), errors.New("timeout"), consume.Nak, time.Second},
		{"in flight", context.Background(), fmt.Errorf("x: %w", engine.ErrInFlight), consume.Nak, time.Second},
		{"store unavailable", context.Background(), fmt.Errorf("x: %w", engine.ErrStoreUnavailable), consume.Nak, time.Second},
		{"shutting down", done, context.Canceled, consume.Nak, 0},
		{"key mismatch", context.Background(), fmt.Errorf("x: %w", engine.ErrKeyMismatch), consume.Term, 0},
		{"outcome unknown", context.Background(), fmt.Errorf("x: %w", engine.ErrOutcomeUnknown), consume.Term, 0},
		{"final", context.Background(), fmt.Errorf("x: %w", permanent), consume.Term, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := h.Decide(tc.ctx, tc.err)
			if d.Action != tc.action || d.Delay != tc.delay {
				t.Errorf("Decide(%v) = %v after %v, want %v after %v", tc.err, d.Action, d.Delay, tc.action, tc.delay)
			}
			if d.Action == consume.Term && d.Reason == "" {
				t.Errorf("Decide(%v): term without a reason", tc.err)
			}
		})
	}
}

func TestNewInvalid(t *testing.T) {
	nop := func(context.Context, engine.ID, []byte) error { return nil }
	if _, err := consume.New(nil); err == nil {
		t.Error("New(nil) err = nil, want an error")
	}
	_, err := consume.New(nop, consume.WithScope(""), consume.WithRetryDelay(-1), consume.WithProgress(-1), consume.WithFinal(nil))
	if err == nil {
		t.Fatal("New(invalid options) err = nil, want an error")
	}
	for _, want := range []string{"empty scope", "retry delay", "progress", "final"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New() err = %q, want it to name %q", err, want)
		}
	}
}

// TestProgress runs an effect three times as long as AckWait with
// WithProgress: the server is told it is in progress and does not deliver
// the message again meanwhile (without the option, it does).
func TestProgress(t *testing.T) {
	const wait = 300 * time.Millisecond
	js, cons, subject := newConsumer(t, wait)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, subject, []byte("slow"), jetstream.WithMsgID("slow-1")); err != nil {
		t.Fatal(err)
	}
	runs := 0
	h, err := consume.New(func(context.Context, engine.ID, []byte) error {
		runs++
		time.Sleep(3 * wait) // work that outlasts AckWait, not a wait for a condition
		return nil
	}, consume.WithProgress(wait/4))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Another instance pulls meanwhile: it would get a redelivery.
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	redelivered := make(chan int)
	go func() {
		n := 0
		for {
			m, err := it.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				redelivered <- n
				return
			}
			if err == nil {
				n++
				_ = m.Ack()
			}
		}
	}()
	d, err := h.Handle(ctx, msg)
	it.Stop()
	if n := <-redelivered; n != 0 {
		t.Errorf("redeliveries during the effect = %d, want 0", n)
	}
	if err != nil || d.Action != consume.Ack || runs != 1 {
		t.Errorf("Handle() = %v, %v after %d runs, want ack after 1", d.Action, err, runs)
	}
}
