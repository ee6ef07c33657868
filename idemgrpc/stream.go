package idemgrpc

import (
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/engine"
)

// WithStreamsUnprotected runs a streaming call that carries an idempotency
// key, on a protected method, unprotected, as if it had none, instead of
// refusing it with Unimplemented (STREAMING_UNSUPPORTED): for a service
// whose clients send a key with every call, and whose streaming methods are
// safe to repeat. The first such call is logged at warn level, and each is
// told to the observer as EventUnprotected.
func WithStreamsUnprotected() ServerOption { return func(c *serverConfig) { c.streams = true } }

// interceptStream refuses, or runs unprotected, a streaming call that
// carries a key: see StreamServerInterceptor.
func (s *Server) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !s.cfg.protect(info.FullMethod) {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get(MetadataKey)) == 0 {
		return handler(srv, ss)
	}
	var start time.Time
	if s.cfg.eng.Observer != nil {
		start = time.Now()
	}
	if !s.cfg.streams {
		return s.reject(ctx, start, "", codes.Unimplemented, ReasonStreaming,
			"idempotency keys are not supported on streaming calls, which cannot be replayed: the call did not run; send it without the "+MetadataKey+" metadata, or make the method unary")
	}
	if !s.streamsWarned.Load() && !s.streamsWarned.Swap(true) {
		s.eng.Logger().LogAttrs(ctx, slog.LevelWarn,
			"idemgrpc: streaming call with an idempotency key runs unprotected (WithStreamsUnprotected): a retry runs it again",
			slog.String("method", info.FullMethod))
	}
	err := handler(srv, ss)
	s.eng.Observe(ctx, engine.Event{Kind: engine.EventUnprotected, Status: int(status.Code(err)), Start: start})
	return err
}
