// Package e2e holds the end-to-end tests of the module: the client and the
// server middleware together, over real loopback connections, through a
// network that loses responses, on every kind of store. It has no code of
// its own.
//
// Besides the lossy-network tests, it runs the fault runs of
// internal/testkit/faultrun on every store: orders through a lossy network with a
// black hole, a cut store or a store slower than its timeout (TestFaultRun);
// concurrent clients over shared keys whose recorded history is checked for
// linearizability against the protocol (TestHistory); a 503 storm and the
// recovery after it (TestOutageAmplification); and a store outage across a
// Complete whose response is lost (TestCompleteAfterOutage). The PostgreSQL
// and Redis stores are reached through TCP proxies that the tests start,
// never by stopping the shared servers.
//
// The fault runs are short by default. Two flags change them:
//
//	-faultrun.long      full size (10,000 orders per store), as RELIABILITY.md reports
//	-faultrun.seed=N    the seed of every fault they inject (default 1)
//
// For example:
//
//	go test ./internal/tests/e2e -run 'TestFaultRun|TestHistory|TestOutageAmplification' -faultrun.long -faultrun.seed=1 -v -timeout 2h
package e2e
