package idemgrpc

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// interceptStream refuses a streaming call of a protected method that
// carries a key: see StreamServerInterceptor.
func (s *Server) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !s.cfg.protect(info.FullMethod) {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	if len(metadata.ValueFromIncomingContext(ctx, MetadataKey)) == 0 {
		return handler(srv, ss)
	}
	var start time.Time
	if s.cfg.eng.Observer != nil {
		start = time.Now()
	}
	return s.reject(ctx, start, "", codes.Unimplemented, reasonStreaming,
		"idempotency keys are not supported on streaming calls, which cannot be replayed: the call did not run; send it without the "+MetadataKey+" metadata, leave the method out of WithMethods, or make the method unary")
}
