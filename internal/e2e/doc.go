// Package e2e holds the end-to-end tests of the module: the client and the
// server middleware together, over real loopback connections, through a
// network that loses responses, on every kind of store. It has no code of
// its own.
package e2e
