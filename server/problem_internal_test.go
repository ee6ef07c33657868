package server

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/wire"
)

// TestProblemTableMatchesCode: every refusal has a code, and the table in
// the package documentation lists each, with its status and sentinel, as
// the code writes them.
func TestProblemTableMatchesCode(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	row := func(code string, status int, anchor string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^//\t` + regexp.QuoteMeta(code) + ` +` + strconv.Itoa(status) + ` +` + regexp.QuoteMeta(anchor) + ` `)
	}
	for kind, r := range refusals {
		code := codes[kind]
		if !assert.NotEmpty(t, code, "%s has no code", r.anchor) {
			continue
		}
		assert.Regexp(t, row(code, r.status, r.anchor), string(doc), "doc.go's table lacks %s", r.anchor)
	}
	assert.Regexp(t, row(wire.CodeKeyTooLong, refusals[ErrInvalidKey].status, "ErrInvalidKey"), string(doc))
	assert.Len(t, regexp.MustCompile(`(?m)^//\t[a-z_]+ +[0-9]{3} +Err`).FindAll(doc, -1), len(refusals)+1,
		"doc.go's table has a row the code does not")
}
