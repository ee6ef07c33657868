// The compatibility harness of the contract kit: its own module, so that
// neither its programs nor its Node files are in the root module's zip.
// It is never published, and builds against the repository as checked out.
module github.com/idemkit/idempotency/compat

go 1.26.0

replace github.com/idemkit/idempotency => ../

require github.com/idemkit/idempotency v0.0.0
