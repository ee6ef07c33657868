package idemgrpc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idempotency/engine"
)

type serverConfig struct {
	eng       engine.Config
	protect   func(fullMethod string) bool
	optional  bool
	scope     func(ctx context.Context, fullMethod string) (string, error)
	scopeSet  bool // WithScope was given
	keyFormat func(key string) error
	types     map[string]protoreflect.MessageType
	keep      func(codes.Code) bool
	errs      []error
}

func (c *serverConfig) refuse(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("idemgrpc: "+format, args...))
}

// Server protects the unary methods of a gRPC server with idempotency keys:
// a call with a key the store has seen gets the answer stored by the first,
// and the handler runs at most once per key while the record lives. It is
// the gRPC door of package engine, which runs the protocol. Install it
// with grpc.NewServer(s.ServerOptions()...), after the application's own
// options, and call Shutdown after the gRPC server's GracefulStop. It is
// safe for concurrent use.
type Server struct {
	eng  *engine.Engine
	cfg  *serverConfig
	wire *wire // the codec and stats handler that see the requests' bytes

	learned sync.Map // full method -> protoreflect.MessageType, from the answers the handlers gave

	// What is logged once per Server.
	bearerScope  atomic.Bool
	bytesUnseen  atomic.Bool
	keepPanicked atomic.Bool
}

// NewServer returns a Server that keeps its records in store. It returns an
// error naming every invalid option.
func NewServer(store engine.Store, opts ...Option) (*Server, error) {
	c := &serverConfig{
		protect: func(string) bool { return true },
		scope:   credentialScope,
		types:   make(map[string]protoreflect.MessageType),
		keep:    defaultKeep,
	}
	o := &options{srv: c}
	for i, opt := range opts {
		if opt == nil {
			c.refuse("option %d is nil", i)
			continue
		}
		opt(o)
	}
	eng, err := engine.New(store, c.eng)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("idemgrpc: %w", err))
	}
	if len(c.errs) > 0 {
		return nil, errors.Join(c.errs...)
	}
	return &Server{eng: eng, cfg: c, wire: newWire()}, nil
}

// keeps reports whether a handler's error with code is kept, by the function
// of WithKeep. It is called while the key is held: a panic in it would
// leave the key claimed until its lease ended, so it is recovered and
// logged once, and the default decides.
func (s *Server) keeps(ctx context.Context, code codes.Code) (keep bool) {
	defer func() {
		if v := recover(); v != nil {
			if !s.keepPanicked.Swap(true) {
				s.eng.Logger().LogAttrs(ctx, slog.LevelError, "idemgrpc: keep function panicked; the default decides instead, and its panics are not logged again",
					slog.String("code", code.String()), slog.String("panic", fmt.Sprint(v)))
			}
			keep = defaultKeep(code)
		}
	}()
	return s.cfg.keep(code)
}

// Shutdown waits until the answers that were sent before they could be
// stored are stored, or ctx ends. Call it after the gRPC server has stopped.
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.eng.Shutdown(ctx); err != nil {
		return fmt.Errorf("idemgrpc: shutdown: %w", err)
	}
	return nil
}

// ServerOptions returns the options that install s in a grpc.Server: its
// unary and stream interceptors, and the codec (grpc.ForceServerCodecV2,
// protobuf's) and stats handler through which it sees each request's bytes
// as the client sent them, of which a call's fingerprint is made:
//
//	srv := grpc.NewServer(append(yourOptions, guard.ServerOptions()...)...)
//
// gRPC chains interceptors in the order of its options, so the
// interceptors of options given before these run first: put an
// authentication interceptor, whose principal WithScope reads, before
// them. The codec replaces any other codec of the server: requests are
// protocol buffers, and answers are encoded by the codec registered as
// "proto".
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.intercept),
		grpc.ChainStreamInterceptor(s.interceptStream),
		grpc.ForceServerCodecV2(s.wire),
		grpc.StatsHandler(s.wire),
	}
}

// UnaryServerInterceptor returns the interceptor that protects the unary
// calls, for a server that chains its interceptors itself; ServerOptions
// gives it with the rest. Without the codec and stats handler of
// ServerOptions, it does not see the requests' bytes, and fingerprints a
// request encoded again with the server's schema (see Fingerprint): two
// releases whose schemas differ can then refuse each other's retries, which
// is logged once.
func (s *Server) UnaryServerInterceptor() grpc.UnaryServerInterceptor { return s.intercept }

// StreamServerInterceptor returns the interceptor of the streaming calls,
// for a server that chains its interceptors itself (ServerOptions gives it
// with the rest). A streaming call cannot be protected (its answer is not one
// message to store and replay), so it refuses one that carries an
// idempotency key, on a protected method, with Unimplemented and the reason
// STREAMING_UNSUPPORTED, rather than let the caller believe it protected; it
// does not run; leave the method out of WithMethods to let it run. A
// streaming call without a key goes through.
func (s *Server) StreamServerInterceptor() grpc.StreamServerInterceptor { return s.interceptStream }

// credentialScope is the default scope: a hash of the values of the
// authorization metadata, "cred:" and 32 hex digits, or "" for a call
// without it. A refreshed token is another scope: see WithScope.
func credentialScope(ctx context.Context, _ string) (string, error) {
	values := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(values) == 0 || len(values) == 1 && values[0] == "" {
		return "", nil
	}
	b := []byte("idemgrpc scope v1")
	b = binary.BigEndian.AppendUint64(b, uint64(len(values)))
	for _, v := range values {
		b = appendString(b, v)
	}
	sum := sha256.Sum256(b)
	return "cred:" + hex.EncodeToString(sum[:16]), nil
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// fingerprintMessage returns the fingerprint of a call from its decoded request:
// the SHA-256, in hex, of its full method and of req marshalled
// deterministically. The server interceptor uses it when it did not see the
// request's bytes (it was installed without the codec and stats handler of
// ServerOptions); otherwise a call's fingerprint is the same hash of the
// bytes as the client sent them, which is the same value whenever the
// client's encoding is the deterministic one of the server's schema. A key
// sent again with another fingerprint is refused (FailedPrecondition,
// KEY_MISMATCH).
func fingerprintMessage(fullMethod string, req proto.Message) (string, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", fmt.Errorf("idemgrpc: fingerprint: %w", err)
	}
	return fingerprint(fullMethod, body), nil
}

// fingerprint is the SHA-256, in hex, of fullMethod and body.
func fingerprint(fullMethod string, body []byte) string {
	h := sha256.New()
	h.Write(appendString(nil, fullMethod))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

func checkKey(key string) error {
	if key == "" {
		return errors.New("the key is empty")
	}
	if len(key) > 255 {
		return fmt.Errorf("the key is %d bytes long, more than 255", len(key))
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Errorf("the key has a byte 0x%02x outside printable ASCII", key[i])
		}
	}
	return nil
}

func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	// Taken first, whatever becomes of the call: they are not kept past
	// the interceptor.
	body, seen := takeRequestBytes(ctx)
	if !s.cfg.protect(info.FullMethod) {
		return handler(ctx, req)
	}
	var start time.Time
	if s.cfg.eng.Observer != nil {
		start = time.Now()
	}
	// The one key's values, not a copy of the whole metadata.
	keys := metadata.ValueFromIncomingContext(ctx, MetadataKey)
	switch {
	case len(keys) == 0 && s.cfg.optional:
		resp, err := handler(ctx, req)
		s.eng.Observe(ctx, engine.Event{Kind: engine.EventUnprotected, Status: int(status.Code(err)), Start: start})
		return resp, err
	case len(keys) == 0:
		return nil, s.reject(ctx, start, "", codes.InvalidArgument, reasonKeyMissing, "idempotency key missing: send it in the "+MetadataKey+" metadata")
	case len(keys) > 1:
		return nil, s.reject(ctx, start, "", codes.InvalidArgument, reasonKeyInvalid, "idempotency key invalid: "+strconv.Itoa(len(keys))+" values")
	}
	key := keys[0]
	err := checkKey(key)
	if err == nil && s.cfg.keyFormat != nil {
		err = s.cfg.keyFormat(key)
	}
	if err != nil {
		return nil, s.reject(ctx, start, "", codes.InvalidArgument, reasonKeyInvalid, "idempotency key invalid: "+err.Error())
	}
	var fp string
	if seen {
		// What the client sent, whatever this server's schema.
		fp = fingerprint(info.FullMethod, body)
	} else {
		msg, ok := req.(proto.Message)
		if !ok {
			return nil, s.reject(ctx, start, key, codes.InvalidArgument, reasonUnidentified, fmt.Sprintf("request could not be identified: %T is not a protocol buffer message", req))
		}
		if fp, err = fingerprintMessage(info.FullMethod, msg); err != nil {
			return nil, s.reject(ctx, start, key, codes.InvalidArgument, reasonUnidentified, "request could not be identified: "+err.Error())
		}
		if !s.bytesUnseen.Load() && !s.bytesUnseen.Swap(true) {
			s.eng.Logger().LogAttrs(ctx, slog.LevelWarn,
				"idemgrpc: the request's bytes were not seen, so its fingerprint is made of the request encoded again with this server's schema, which a release that adds a field changes; install the Server with its ServerOptions",
				slog.String("method", info.FullMethod))
		}
	}
	scope, err := s.cfg.scope(ctx, info.FullMethod)
	if err != nil {
		return nil, s.reject(ctx, start, key, codes.InvalidArgument, reasonUnidentified, "request could not be identified: scope: "+err.Error())
	}
	if len(scope) > engine.MaxScopeLen {
		// A store could not keep it: refused, not answered as an outage
		// to retry forever.
		return nil, s.reject(ctx, start, key, codes.InvalidArgument, reasonUnidentified, fmt.Sprintf("request could not be identified: scope of %d bytes, more than %d", len(scope), engine.MaxScopeLen))
	}
	if scope != "" && !s.cfg.scopeSet && !s.bearerScope.Load() && bearer(ctx) && !s.bearerScope.Swap(true) {
		s.eng.Logger().LogAttrs(ctx, slog.LevelWarn,
			"idemgrpc: call scoped by a bearer token: a retry whose token was refreshed falls in another scope, and runs again; set WithScope to the authenticated principal",
			slog.String("method", info.FullMethod))
	}
	d := &door{s: s, method: info.FullMethod, req: req, handler: handler}
	d.err = status.Error(codes.Canceled, "idemgrpc: the caller went away before the call ran")
	d.ctx = ctx
	if ts := grpc.ServerTransportStreamFromContext(ctx); ts != nil {
		d.stream = captureStream{ServerTransportStream: ts, d: d}
		d.ctx = grpc.NewContextWithServerTransportStream(ctx, &d.stream)
	}
	d.call.Start = start
	s.eng.Do(d.ctx, &d.call, engine.ID{Scope: scope, Key: key}, fp, d)
	return d.resp, d.err
}

// reject refuses a call before any claim, with code and reason, and tells
// the observer (EventRejected). key is the call's key once it is known to
// be valid, "" before.
func (s *Server) reject(ctx context.Context, start time.Time, key string, code codes.Code, reason, msg string) error {
	err := refusal(code, reason, msg, 0)
	s.eng.Observe(ctx, engine.Event{Kind: engine.EventRejected, Key: key, Status: int(code), Start: start, Err: err})
	return err
}

// bearer reports whether the call's authorization metadata holds a bearer
// token (what gRPC's OAuth and JWT credentials send).
func bearer(ctx context.Context) bool {
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if len(v) > len("Bearer ") && strings.EqualFold(v[:len("Bearer ")], "Bearer ") {
			return true
		}
	}
	return false
}

// refusal is an answer the interceptor makes itself, with the idempotency
// ErrorInfo and, when retryAfter > 0, a RetryInfo detail.
func refusal(code codes.Code, reason, msg string, retryAfter time.Duration) error {
	st := status.New(code, "idemgrpc: "+msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// responseType returns the type of fullMethod's response message.
func (s *Server) responseType(fullMethod string) (protoreflect.MessageType, error) {
	if t, ok := s.cfg.types[fullMethod]; ok {
		return t, nil
	}
	if t, ok := s.learned.Load(fullMethod); ok {
		return t.(protoreflect.MessageType), nil
	}
	name := strings.TrimPrefix(fullMethod, "/")
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return nil, fmt.Errorf("idemgrpc: method %q is not /service/method", fullMethod)
	}
	desc, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name[:i]))
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: service of %s: %w", fullMethod, err)
	}
	sd, ok := desc.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("idemgrpc: %s is not a service", name[:i])
	}
	m := sd.Methods().ByName(protoreflect.Name(name[i+1:]))
	if m == nil {
		return nil, fmt.Errorf("idemgrpc: service %s has no method %s", name[:i], name[i+1:])
	}
	t, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: response type of %s: %w", fullMethod, err)
	}
	return t, nil
}
