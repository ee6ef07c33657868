// Package crash holds the process-crash tests of the module: an orders API
// (the program in crashserver) is killed with SIGKILL while its handlers are
// half-way through their work, started again on the same store, and sent the
// same orders by a client that retries throughout; the tests then count, in
// the database, the orders that ran twice and those left half done. It has no
// code of its own.
package crash
