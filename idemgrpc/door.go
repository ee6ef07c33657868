package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/engine"
)

// Prefixes of the names under which a stored Response keeps the handler's
// header and trailer metadata.
const (
	storedHeader  = "h:"
	storedTrailer = "t:"
)

// door is the gRPC door of one call: the engine runs the protocol and
// answers through it. Its answer is resp and err, returned by the
// interceptor once Do returns.
type door struct {
	s       *Server
	method  string
	req     any
	handler grpc.UnaryHandler
	ctx     context.Context // the call's, with stream
	stream  captureStream
	call    engine.Call

	// What Execute (or OutcomeUnknown) produced, for Send.
	out    any
	outErr error

	resp any
	err  error
}

// captureStream records the header and trailer metadata the handler sets,
// so that they are stored with its answer.
type captureStream struct {
	grpc.ServerTransportStream
	d *door

	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
}

func (c *captureStream) SetHeader(md metadata.MD) error {
	err := c.ServerTransportStream.SetHeader(md)
	if err == nil {
		c.mu.Lock()
		c.header = metadata.Join(c.header, md)
		c.mu.Unlock()
	}
	return err
}

func (c *captureStream) SendHeader(md metadata.MD) error {
	err := c.ServerTransportStream.SendHeader(md)
	if err == nil {
		c.mu.Lock()
		c.header = metadata.Join(c.header, md)
		c.mu.Unlock()
	}
	return err
}

func (c *captureStream) SetTrailer(md metadata.MD) error {
	err := c.ServerTransportStream.SetTrailer(md)
	if err == nil {
		c.mu.Lock()
		c.trailer = metadata.Join(c.trailer, md)
		c.mu.Unlock()
	}
	return err
}

// captured returns the metadata set so far, in a stored Response's shape.
func (c *captureStream) captured() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.header) == 0 && len(c.trailer) == 0 {
		return nil
	}
	h := make(map[string][]string, len(c.header)+len(c.trailer))
	for k, v := range c.header {
		h[storedHeader+k] = append([]string(nil), v...)
	}
	for k, v := range c.trailer {
		h[storedTrailer+k] = append([]string(nil), v...)
	}
	return h
}

// Execute runs the handler once and says what to keep of its answer.
func (d *door) Execute(ctx context.Context) engine.Outcome {
	resp, err := d.handler(ctx, d.req)
	d.out, d.outErr = resp, err
	if err != nil {
		st := status.Convert(err)
		code := st.Code()
		if !d.s.keeps(ctx, code) {
			o := engine.Outcome{Status: int(code), Reason: "the handler returned " + code.String()}
			if ctx.Err() != nil {
				o.Cause = context.Cause(ctx)
			}
			return o
		}
		body, merr := marshalStatus(st.Proto())
		if merr != nil {
			return engine.Outcome{Status: int(code), Reason: "the handler's status could not be marshalled: " + merr.Error()}
		}
		return engine.Outcome{Status: int(code), Response: &engine.Response{Status: int(code), Header: d.stream.captured(), Body: body}}
	}
	msg, ok := resp.(proto.Message)
	if !ok || msg == nil {
		return engine.Outcome{Reason: fmt.Sprintf("the handler's answer %T is not a protocol buffer message", resp)}
	}
	body, merr := proto.Marshal(msg)
	if merr != nil {
		return engine.Outcome{Reason: "the handler's answer could not be marshalled: " + merr.Error()}
	}
	d.s.learned.LoadOrStore(d.method, msg.ProtoReflect().Type())
	return engine.Outcome{Response: &engine.Response{Status: int(codes.OK), Header: d.stream.captured(), Body: body}}
}

// Send answers with what Execute or OutcomeUnknown produced. gRPC sends a
// unary answer when the interceptor returns, so with now set (the store
// write goes on on this goroutine) the answer waits for that write.
func (d *door) Send(bool) {
	d.resp, d.err = d.out, d.outErr
}

// Replay answers with a stored answer.
func (d *door) Replay(r *engine.Response) int {
	hdr, trl := splitStored(r.Header)
	hdr.Set(metadataReplayed, "true")
	// Straight to the call's stream: the capture is for a handler's
	// metadata, and a replay runs none.
	if ts := d.stream.ServerTransportStream; ts != nil {
		_ = ts.SetHeader(hdr)
		if len(trl) > 0 {
			_ = ts.SetTrailer(trl)
		}
	}
	if v := r.Header[engine.HeaderOutcome]; len(v) > 0 && v[0] == "unknown" {
		d.resp, d.err = nil, outcomeUnknownError()
		return int(codes.DataLoss)
	}
	code := codes.Code(r.Status)
	if r.BodyOmitted && code != codes.OK {
		d.resp, d.err = nil, status.Errorf(code, "idemgrpc: the stored %v answer of %s was too large to keep whole; its message and details are lost", code, d.method)
		return int(code)
	}
	if code != codes.OK {
		sp, err := unmarshalStatus(r.Body)
		if err != nil {
			d.resp, d.err = nil, status.Errorf(codes.Internal, "idemgrpc: stored status of %s unreadable: %v", d.method, err)
			return int(codes.Internal)
		}
		d.resp, d.err = nil, status.FromProto(sp).Err()
		return int(code)
	}
	if r.BodyOmitted {
		d.resp, d.err = nil, refusal(codes.DataLoss, reasonResponseOmitted, "the call ran, but its answer was too large to keep and cannot be replayed", 0)
		return int(codes.DataLoss)
	}
	t, err := d.s.responseType(d.method)
	if err != nil {
		d.resp, d.err = nil, status.Error(codes.Internal, err.Error())
		return int(codes.Internal)
	}
	m := t.New().Interface()
	if err := proto.Unmarshal(r.Body, m); err != nil {
		d.resp, d.err = nil, status.Errorf(codes.Internal, "idemgrpc: stored answer of %s unreadable: %v", d.method, err)
		return int(codes.Internal)
	}
	d.resp, d.err = m, nil
	return int(codes.OK)
}

// Refuse answers with one of the protocol's refusals.
func (d *door) Refuse(kind error, retryAfter time.Duration, _ error) int {
	d.resp = nil
	code := codes.Internal
	switch {
	case errors.Is(kind, engine.ErrInFlight):
		code = codes.Aborted
		d.err = refusal(code, reasonInFlight, "a call with this idempotency key is in flight; retry later", retryAfter)
	case errors.Is(kind, engine.ErrKeyMismatch):
		code = codes.FailedPrecondition
		d.err = refusal(code, reasonKeyMismatch, "idempotency key reused for a different request", 0)
	case errors.Is(kind, engine.ErrStoreUnavailable):
		code = codes.Unavailable
		d.err = refusal(code, reasonStoreUnavailable, "idempotency store unavailable; the call did not run", retryAfter)
	default:
		d.err = status.Errorf(code, "idemgrpc: %v", kind)
	}
	if retryAfter > 0 && code != codes.FailedPrecondition {
		secs := int64((retryAfter + time.Second - 1) / time.Second)
		_ = grpc.SetTrailer(d.ctx, metadata.Pairs(metadataRetryAfter, strconv.FormatInt(secs, 10)))
	}
	return int(code)
}

// OutcomeUnknown is the record kept for a key whose earlier holders were
// lost, under engine.RefuseAbandoned.
func (d *door) OutcomeUnknown() *engine.Response {
	err := outcomeUnknownError()
	d.out, d.outErr = nil, err
	body, _ := marshalStatus(status.Convert(err).Proto())
	return &engine.Response{
		Status: int(codes.DataLoss),
		Header: map[string][]string{engine.HeaderOutcome: {"unknown"}},
		Body:   body,
	}
}

func outcomeUnknownError() error {
	return refusal(codes.DataLoss, reasonOutcomeUnknown, "an earlier call with this idempotency key was lost while it ran: whether it took effect is unknown; do not retry, check", 0)
}

// Unprotected runs the handler without protection (engine.Config.FailOpen).
func (d *door) Unprotected() {
	d.resp, d.err = d.handler(d.ctx, d.req)
}

// splitStored returns the header and trailer metadata of a stored answer.
func splitStored(h map[string][]string) (header, trailer metadata.MD) {
	header, trailer = metadata.MD{}, metadata.MD{}
	for k, v := range h {
		switch {
		case strings.HasPrefix(k, storedHeader):
			header[k[len(storedHeader):]] = v
		case strings.HasPrefix(k, storedTrailer):
			trailer[k[len(storedTrailer):]] = v
		}
	}
	return header, trailer
}
