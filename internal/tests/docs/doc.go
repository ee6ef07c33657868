// Package docs holds the tests that keep the repository's documentation
// true: every Go block in a README is the body of an Example function,
// which go test compiles and, with its Output comment, runs.
package docs
