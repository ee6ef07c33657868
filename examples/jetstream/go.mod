module github.com/idemkit/idempotency/examples/jetstream

go 1.26.0

require (
	github.com/idemkit/idempotency v0.1.0
	github.com/nats-io/nats.go v1.55.0
	go.uber.org/goleak v1.3.0
)
