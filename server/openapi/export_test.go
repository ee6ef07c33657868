package openapi

// Problems returns the problems the fragment describes, for the tests that
// check the middleware's answers against them.
func Problems() []problem { return problems() }

// Problem is a problem the fragment describes.
type Problem = problem
