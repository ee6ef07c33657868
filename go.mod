module github.com/idemkit/idempotency

go 1.26
