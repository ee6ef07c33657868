module github.com/idemkit/idempotency/idemgrpc

go 1.26.0

require (
	github.com/google/uuid v1.6.0
	github.com/idemkit/idempotency v0.1.0
	go.uber.org/goleak v1.3.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)
