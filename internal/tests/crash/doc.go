// Package crash holds the process-crash tests of the module: an orders API
// (the program in crashserver) is killed with SIGKILL while its handlers are
// half-way through their work, started again on the same store, and sent the
// same orders by a client that retries throughout; the tests then count, in
// the database, the orders that ran twice and those left half done.
//
// TestCrash has the killed API write the orders itself, in each store and
// mode, with either policy for an abandoned claim (engine.Config.Abandoned).
// TestDownstreamCrash has it send each order, through an idempotency.Client,
// to a second orders service behind the middleware, which writes it: with
// the handler's request context the client derives the downstream key from
// the incoming key, and a rerun after a crash is answered with the
// downstream service's replay; with a new key in each run, the same crashes
// write orders twice. TestStepsCrash has a handler of three steps (package
// step): a charge through the client to a payment service, an email to a
// sink that counts, and the order in a transactional step on PostgreSQL; it
// counts, per step, the completed steps run again (never) and the steps cut
// between their effect and their record, against the same effects without
// steps, and the "outcome unknown" answers by step under RefuseAbandoned.
// TestMemstoreCrash shows what a restart does to the
// memory store: it forgets every record, and every order runs again.
//
// The flag -crash.long runs them at the size of the figures in
// RELIABILITY.md. The package has no code of its own.
package crash
