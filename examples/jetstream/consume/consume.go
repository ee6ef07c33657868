// Package consume runs the effect of each JetStream message at most once,
// whatever the broker redelivers, by keying it with the publisher's message
// ID (the Nats-Msg-Id header) and passing it through an idempotency door
// such as once.Do.
//
// JetStream delivers at least once: a message whose acknowledgement does not
// reach the server within the consumer's AckWait (the handler was slow, its
// process died after the effect, the ack was lost) is delivered again, to
// this consumer or to another instance bound to the same durable consumer.
// A Handler makes those deliveries safe: the first runs the effect and its
// result is stored under the message's ID; the later ones get the stored
// result and only acknowledge.
//
// The ID of a message is [ID]: Scope is the stream and the durable consumer
// ("ORDERS/billing"), Key is the Nats-Msg-Id header. The scope names the
// effect, not the message: two consumers of one stream do two different
// things with the same message, and each must run its own effect once. All
// the instances of one service share one durable consumer, and so one scope.
// Give the scope yourself with [WithScope] when the consumer's name is not
// stable (an ephemeral or ordered consumer gets a new random name each time).
//
// The key is the publisher's Nats-Msg-Id, not the stream sequence: a message
// that is published again (a publisher that retried after its PubAck was lost,
// outside the stream's duplicate window, or a message copied to another
// stream by a source or a mirror) gets a new sequence but keeps its ID.
// A message without the header is terminated by default (the broker will not
// redeliver it, and an advisory tells an operator); [WithSequenceKey] keys it
// by its stream sequence instead, which is safe against redelivery only.
package consume

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/engine"
)

// ErrNoMsgID is returned, wrapped, by [ID] for a message without a
// Nats-Msg-Id header.
var ErrNoMsgID = errors.New("consume: message has no " + jetstream.MsgIDHeader + " header")

// Func runs the effect of the message whose idempotency ID is id and whose
// data is data, at most once per id: a door such as once.Do (see [Once]), or,
// to see what the door prevents, the effect called directly.
type Func func(ctx context.Context, id engine.ID, data []byte) error

// Handler handles JetStream messages: it runs each one through its Func and
// acknowledges it according to the outcome. It is safe for concurrent use.
type Handler struct {
	run Func
	cfg config
}

// New returns a Handler that runs each message through run.
func New(run Func, opts ...Option) (*Handler, error) {
	if run == nil {
		return nil, errors.New("consume: nil Func")
	}
	cfg := config{retryDelay: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if err := errors.Join(cfg.errs...); err != nil {
		return nil, err
	}
	return &Handler{run: run, cfg: cfg}, nil
}

// Handle runs msg and acknowledges it: it is [Handler.Process] followed by
// [Decision.Settle]. It returns what was done, and the error of the
// acknowledgement, if any (a lost ack is harmless: the redelivery is
// answered from the stored result). A panic in the Func goes on, and the
// message is left unsettled (see Process).
func (h *Handler) Handle(ctx context.Context, msg jetstream.Msg) (Decision, error) {
	d := h.Process(ctx, msg)
	return d, d.Settle(msg)
}

// Process runs msg through the Handler's Func and decides what to tell the
// broker, without telling it yet. While the Func runs, Process tells the
// server every WithProgress interval that the message is in progress.
//
// A panic in the Func stops the progress reports and goes on to the caller
// (once.Do released the key first): the message is left unsettled, and the
// broker delivers it again after AckWait. Recover it around Handle to keep
// consuming; the redelivery runs the effect again.
func (h *Handler) Process(ctx context.Context, msg jetstream.Msg) Decision {
	id, err := h.ID(msg)
	if err != nil {
		return Decision{Action: Term, Reason: err.Error(), Err: err}
	}
	// Deferred: a message said to be in progress for ever after a panic
	// would never be delivered again.
	defer h.progress(msg)()
	err = h.run(ctx, id, msg.Data())
	return h.Decide(ctx, err)
}

// ID returns the idempotency ID the Handler gives msg: [ID], with the scope
// of WithScope if it was given, and the stream sequence as the key under
// WithSequenceKey when the message has no Nats-Msg-Id.
func (h *Handler) ID(msg jetstream.Msg) (engine.ID, error) {
	id, err := ID(msg)
	if err != nil && !(h.cfg.seqKey && errors.Is(err, ErrNoMsgID)) {
		return engine.ID{}, err
	}
	md, mdErr := msg.Metadata()
	if mdErr != nil {
		return engine.ID{}, fmt.Errorf("consume: metadata: %w", mdErr)
	}
	if err != nil {
		id.Key = "seq:" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	if h.cfg.scope != "" {
		id.Scope = h.cfg.scope
	}
	return id, nil
}

// ID returns the idempotency ID of a message delivered by JetStream: Scope
// is the stream's name and the consumer's, joined by a slash, and Key is the
// message's Nats-Msg-Id header. It fails with an error wrapping [ErrNoMsgID]
// when the header is missing or empty.
func ID(msg jetstream.Msg) (engine.ID, error) {
	md, err := msg.Metadata()
	if err != nil {
		return engine.ID{}, fmt.Errorf("consume: metadata: %w", err)
	}
	scope := md.Stream + "/" + md.Consumer
	key := msg.Headers().Get(jetstream.MsgIDHeader)
	if key == "" {
		return engine.ID{Scope: scope}, fmt.Errorf("%w (stream sequence %d)", ErrNoMsgID, md.Sequence.Stream)
	}
	return engine.ID{Scope: scope, Key: key}, nil
}

// progress sends InProgress for msg every WithProgress interval until the
// returned function is called; that function returns once the goroutine it
// started has stopped.
func (h *Handler) progress(msg jetstream.Msg) (stop func()) {
	if h.cfg.progress <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(h.cfg.progress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				// A lost InProgress only risks a redelivery, which the
				// door answers.
				_ = msg.InProgress()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}
