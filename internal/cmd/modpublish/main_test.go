package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// repo makes a git work tree holding a module, with files of every kind
// that publish must tell apart.
func repo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	git := exec.Command("git", "init", "-q", dir)
	out, err := git.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for name, content := range map[string]string{
		"go.mod":           "module example.com/Mod\n\ngo 1.26\n",
		"mod.go":           "package mod\n",
		"new.go":           "package mod // untracked, not ignored\n",
		".gitignore":       "/mod-binary\n",
		"mod-binary":       "\x7fELF ignored build output",
		"nested/go.mod":    "module example.com/Mod/nested\n\ngo 1.26\n",
		"nested/nested.go": "package nested\n",
		"gone.go":          "package mod // tracked, then deleted\n",
	} {
		path := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	}
	add := exec.Command("git", "add", "go.mod", "mod.go", ".gitignore", "nested", "gone.go")
	add.Dir = dir
	out, err = add.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.Remove(filepath.Join(dir, "gone.go")))
	return dir
}

func TestPublish(t *testing.T) {
	dir := repo(t)
	proxy := t.TempDir()
	require.NoError(t, run(proxy, "v0.1.0", []string{dir}, io.Discard))
	// Published twice, the version is listed once.
	require.NoError(t, run(proxy, "v0.1.0", []string{dir}, io.Discard))

	vdir := filepath.Join(proxy, "example.com", "!mod", "@v")
	checked, err := zip.CheckZip(module.Version{Path: "example.com/Mod", Version: "v0.1.0"}, filepath.Join(vdir, "v0.1.0.zip"))
	require.NoError(t, err)
	const prefix = "example.com/Mod@v0.1.0/"
	assert.ElementsMatch(t, []string{prefix + ".gitignore", prefix + "go.mod", prefix + "mod.go", prefix + "new.go"}, checked.Valid,
		"the zip holds the committable files, without the ignored binary, the deleted file or the nested module")

	gomod, err := os.ReadFile(filepath.Join(vdir, "v0.1.0.mod"))
	require.NoError(t, err)
	assert.Equal(t, "module example.com/Mod\n\ngo 1.26\n", string(gomod))
	list, err := os.ReadFile(filepath.Join(vdir, "list"))
	require.NoError(t, err)
	assert.Equal(t, "v0.1.0\n", string(list))
	info, err := os.ReadFile(filepath.Join(vdir, "v0.1.0.info"))
	require.NoError(t, err)
	assert.Contains(t, string(info), `"Version":"v0.1.0"`)
}

func TestRunRefuses(t *testing.T) {
	dir := repo(t)
	tests := []struct {
		name, out, version string
		dirs               []string
		want               []string
	}{
		{"nothing given", "", "", nil, []string{"-o is required", "-version", "no module directory"}},
		{"version not canonical", t.TempDir(), "v1.2", []string{dir}, []string{`-version "v1.2"`}},
		{"no module", t.TempDir(), "v0.1.0", []string{t.TempDir()}, []string{"go.mod"}},
		{"major version not in the path", t.TempDir(), "v2.0.0", []string{dir}, []string{"v2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(tt.out, tt.version, tt.dirs, io.Discard)
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}
