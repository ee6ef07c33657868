package docs

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// block is one fenced Go block of a README.
type block struct {
	file string // relative to the repository's root
	line int    // of the opening fence
	code string // normalised
}

// TestReadmeBlocksAreExamples: every ```go block in every README.md of the
// repository is, line for line, the body of an Example function somewhere
// in the repository (in any of its modules), so that what a reader copies
// compiles, and runs where the Example has an Output comment. To change a
// block, change its Example and paste the body.
func TestReadmeBlocksAreExamples(t *testing.T) {
	root := repoRoot(t)
	blocks, examples := scan(t, root)
	require.NotEmpty(t, blocks, "no Go block found in any README: the scan is broken")
	require.NotEmpty(t, examples, "no Example function found: the scan is broken")
	for _, b := range blocks {
		if _, ok := examples[b.code]; !ok {
			t.Errorf("%s:%d: this Go block is the body of no Example function; "+
				"write it as one (in an _test.go file) and paste its body here", b.file, b.line)
		}
	}
}

// TestScanFindsDrift: a block that differs from its Example by one
// character is reported, so that the check above can fail.
func TestScanFindsDrift(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	write("go.work", "go 1.26\n")
	write("a/x_test.go", "package a\n\nfunc Example() {\n\tx := 1\n\t_ = x\n}\n")
	write("README.md", "text\n\n```go\nx := 1\n_ = x\n```\n\n```go\nx := 2\n_ = x\n```\n")
	blocks, examples := scan(t, dir)
	require.Len(t, blocks, 2)
	require.Len(t, examples, 1)
	_, first := examples[blocks[0].code]
	_, second := examples[blocks[1].code]
	require.True(t, first, "the block equal to the Example's body must match")
	require.False(t, second, "a block that differs must not match")
	require.Equal(t, 3, blocks[0].line)
}

func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "go.work not found above the test's directory")
		dir = parent
	}
}

// scan returns the README Go blocks under root and the set of Example
// bodies of the _test.go files under it, both normalised.
func scan(t *testing.T, root string) ([]block, map[string]string) {
	var blocks []block
	examples := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		switch {
		case name == "README.md":
			b, err := readmeBlocks(path, rel)
			if err != nil {
				return err
			}
			blocks = append(blocks, b...)
		case strings.HasSuffix(name, "_test.go"):
			if err := exampleBodies(path, examples); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	return blocks, examples
}

func readmeBlocks(path, rel string) ([]block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out   []block
		in    bool
		start int
		lines []string
		n     int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case !in && trimmed == "```go":
			in, start, lines = true, n, nil
		case in && trimmed == "```":
			in = false
			out = append(out, block{file: rel, line: start, code: normalise(strings.Join(lines, "\n"))})
		case in:
			lines = append(lines, line)
		}
	}
	return out, sc.Err()
}

func exampleBodies(path string, into map[string]string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.Contains(src, []byte("func Example")) {
		return nil
	}
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return err
	}
	for _, decl := range file.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Example") || fn.Body == nil {
			continue
		}
		lbrace := fset.Position(fn.Body.Lbrace).Offset
		rbrace := fset.Position(fn.Body.Rbrace).Offset
		body := string(src[lbrace+1 : rbrace])
		into[normalise(stripOutput(body))] = fn.Name.Name
	}
	return nil
}

// stripOutput drops the Example's Output comment and what follows it.
func stripOutput(body string) string {
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "// Output:") || strings.HasPrefix(t, "// Unordered output:") {
			return strings.Join(lines[:i], "\n")
		}
	}
	return body
}

// normalise removes the indentation common to every line, trailing
// spaces and blank lines at either end, so that a block and an Example's
// body compare as a reader sees them.
func normalise(code string) string {
	lines := strings.Split(code, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t")
	}
	for len(lines) > 0 && lines[0] == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	indent := -1
	for _, l := range lines {
		if l == "" {
			continue
		}
		n := len(l) - len(strings.TrimLeft(l, "\t"))
		if indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			lines[i] = l[indent:]
		}
	}
	return strings.Join(lines, "\n")
}
