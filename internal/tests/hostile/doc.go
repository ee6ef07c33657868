// Package hostile holds the tests that send the middleware malformed and
// hostile input over real connections: keys empty, huge, binary, quoted and
// repeated; bodies huge, slow, truncated and lying about their length; floods
// of unique keys, with the resident memory of a server process measured
// under them (the program in floodserver). Each test observes the answer and
// checks that the handler did not run and that the store holds nothing. It
// has no code of its own.
package hostile
