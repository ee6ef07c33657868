module github.com/idemkit/idempotency/idemtest/thirdparty/go/ours

go 1.26.0

// The reference server uses this repository's module as it is checked out.
replace github.com/idemkit/idempotency => ../../../..

require github.com/idemkit/idempotency v0.0.0
