package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

// The A/B mode's server programs are built from source before the run:
// this tree's abserver where it stands; a revision's own copy of it, from
// the revision extracted by git archive; the peer's, from abserver with
// idem_peer.go in place of idem.go, in a module of its own.

const (
	// abserverDir is where the server program is, in every revision that
	// has it.
	abserverDir = "internal/cmd/loadbench/abserver"
	// idemFile is the one file of abserver that imports this module, and
	// peerFile what replaces it for the peer.
	idemFile = "idem.go"
	peerFile = "idem_peer.go"
	// peerModule is the peer's module path; its stores are the nested
	// modules peerModule/pgstore and peerModule/redistore.
	peerModule = "github.com/repenguin22/idemlease"
)

// builder builds server programs into dir.
type builder struct {
	goCmd string
	// root is the working tree's top directory, and module its module
	// path.
	root   string
	module string
	dir    string
	out    io.Writer
}

func newBuilder(dir string, out io.Writer) (*builder, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("loadbench: the A/B mode builds its servers with the go command: %w", err)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return nil, fmt.Errorf("loadbench: the A/B mode runs in a git checkout of the repository: %w", commandErr(err))
	}
	b := &builder{goCmd: goCmd, root: strings.TrimSpace(string(top)), dir: dir, out: out}
	gomod, err := os.ReadFile(filepath.Join(b.root, "go.mod"))
	if err != nil {
		return nil, fmt.Errorf("loadbench: %w", err)
	}
	if b.module = modfile.ModulePath(gomod); b.module == "" {
		return nil, errors.New("loadbench: no module path in the repository's go.mod")
	}
	if _, err := os.Stat(filepath.Join(b.root, abserverDir, idemFile)); err != nil {
		return nil, fmt.Errorf("loadbench: this tree has no server program: %w", err)
	}
	return b, nil
}

// sameDir says whether a and b are the same directory, symbolic links
// followed.
func sameDir(a, b string) bool {
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}

// commandErr adds what a command printed to its error.
func commandErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

// goBuild builds the main package pkg of the module in dir into bin, with
// env added to this process's environment. Every variant is built alike:
// without the workspace, without paths or version control stamps, so that
// two builds of the same source are the same program.
func (b *builder) goBuild(dir, pkg, bin string, env ...string) error {
	cmd := exec.Command(b.goCmd, "build", "-trimpath", "-buildvcs=false", "-o", bin, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off"}, env...)...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// tree builds this tree's server program, uncommitted changes included.
func (b *builder) tree() (string, benchreport.Variant, error) {
	bin := filepath.Join(b.dir, "bin", "this")
	v := benchreport.Variant{Name: variantThis, Source: benchreport.VariantTree, Built: "the working tree"}
	if out, err := exec.Command("git", "-C", b.root, "rev-parse", "--short", "HEAD").Output(); err == nil {
		v.Commit = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "-C", b.root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			v.Commit += "+changes"
		}
	}
	if err := b.goBuild(b.root, "./"+abserverDir, bin); err != nil {
		return "", v, fmt.Errorf("loadbench: building this tree's server: %w", err)
	}
	return bin, v, nil
}

// revision builds rev's own server program, from rev extracted by git
// archive. A revision older than the program gets this tree's, with the
// stores' imports changed to where rev keeps them, and the message says so;
// if that does not build either, the error says why.
func (b *builder) revision(rev, name string) (string, benchreport.Variant, error) {
	v := benchreport.Variant{Name: name, Source: benchreport.VariantRevision}
	out, err := exec.Command("git", "-C", b.root, "rev-parse", "--verify", "--quiet", rev+"^{commit}").Output()
	if err != nil {
		return "", v, fmt.Errorf("loadbench: -ab %s: not a revision of this repository", rev)
	}
	commit := strings.TrimSpace(string(out))
	v.Commit = commit[:min(len(commit), 12)]
	src := filepath.Join(b.dir, "rev")
	if err := b.extract(commit, src); err != nil {
		return "", v, fmt.Errorf("loadbench: -ab %s: extracting the revision: %w", rev, err)
	}
	v.Built = "the revision's " + abserverDir
	if _, err := os.Stat(filepath.Join(src, abserverDir, idemFile)); err != nil {
		moved, err := b.transplant(src)
		if err != nil {
			return "", v, fmt.Errorf("loadbench: -ab %s: the revision has no %s, and this tree's cannot be put in it: %w", rev, abserverDir, err)
		}
		v.Built = "this tree's " + abserverDir + " on the revision's packages (" + moved + ")"
		fmt.Fprintf(b.out, "%s has no %s: building this tree's on its packages (%s)\n", rev, abserverDir, moved)
	}
	bin := filepath.Join(b.dir, "bin", "rev")
	if err := b.goBuild(src, "./"+abserverDir, bin); err != nil {
		return "", v, fmt.Errorf("loadbench: -ab %s: building the revision's server (%s): %w", rev, v.Built, err)
	}
	return bin, v, nil
}

// extract writes the files of commit into dir.
func (b *builder) extract(commit, dir string) error {
	cmd := exec.Command("git", "-C", b.root, "archive", "--format=tar", commit)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	xerr := untar(pipe, dir)
	io.Copy(io.Discard, pipe)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return xerr
}

// untar writes the directories, files and symbolic links of a tar stream
// into dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("archive: %q is outside the tree", h.Name)
		}
		path := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, 0o755)
		case tar.TypeReg:
			err = writeFile(path, tr, os.FileMode(h.Mode)&0o777)
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
				err = os.Symlink(h.Linkname, path)
			}
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode|0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// transplant puts this tree's server program into the revision extracted
// in src, with the imports of the module's stores changed to where the
// revision has them (under store/, or under server/ before), and returns
// where that is.
func (b *builder) transplant(src string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return "", err
	}
	module := modfile.ModulePath(gomod)
	if module == "" {
		return "", errors.New("no module path in its go.mod")
	}
	rewrite := map[string]string{}
	var where []string
	for _, store := range []string{"memstore", "pgstore", "redisstore"} {
		found := ""
		for _, parent := range []string{"store", "server"} {
			if fi, err := os.Stat(filepath.Join(src, parent, store)); err == nil && fi.IsDir() {
				found = parent + "/" + store
				break
			}
		}
		if found == "" {
			return "", fmt.Errorf("neither store/%s nor server/%s", store, store)
		}
		where = append(where, found)
		for _, parent := range []string{"store", "server"} {
			rewrite[`"`+b.module+"/"+parent+"/"+store+`"`] = `"` + module + "/" + found + `"`
		}
	}
	rewrite[`"`+b.module+"/"] = `"` + module + "/"
	files, err := b.serverFiles()
	if err != nil {
		return "", err
	}
	for _, name := range files {
		code, err := os.ReadFile(filepath.Join(b.root, abserverDir, name))
		if err != nil {
			return "", err
		}
		if name == idemFile {
			code = rewriteImports(code, rewrite)
		}
		if err := writeFile(filepath.Join(src, abserverDir, name), bytes.NewReader(code), 0o644); err != nil {
			return "", err
		}
	}
	return strings.Join(where, ", "), nil
}

// rewriteImports replaces each quoted import path of rewrite, whole paths
// first.
func rewriteImports(code []byte, rewrite map[string]string) []byte {
	s := string(code)
	for from, to := range rewrite {
		if strings.HasSuffix(from, `"`) {
			s = strings.ReplaceAll(s, from, to)
		}
	}
	for from, to := range rewrite {
		if !strings.HasSuffix(from, `"`) {
			s = strings.ReplaceAll(s, from, to)
		}
	}
	return []byte(s)
}

// serverFiles returns the names of the server program's files in this
// tree: its package's Go files, tests and the peer's file left out.
func (b *builder) serverFiles() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(b.root, abserverDir))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") && n != peerFile {
			names = append(names, n)
		}
	}
	return names, nil
}

// peer builds the peer's server program: this tree's with idem_peer.go in
// place of idem.go, in a module whose go.mod is this tree's (so that both
// run on the same versions of pgx and go-redis) with the peer's modules
// replaced by the directories of peerDir. Nothing is downloaded: the
// modules that this tree needs are in the module cache already, and the
// peer's source is peerDir's.
func (b *builder) peer(peerDir string) (string, benchreport.Variant, error) {
	v := benchreport.Variant{Name: variantPeer, Source: benchreport.VariantPeer}
	abs, err := filepath.Abs(peerDir)
	if err != nil {
		return "", v, err
	}
	v.Built = peerModule + " from " + abs
	// A checkout of the peer says its commit; an extracted archive has none
	// (and must not be taken for a repository around it).
	if top, err := exec.Command("git", "-C", abs, "rev-parse", "--show-toplevel").Output(); err == nil && sameDir(strings.TrimSpace(string(top)), abs) {
		if out, err := exec.Command("git", "-C", abs, "rev-parse", "--short=12", "HEAD").Output(); err == nil {
			v.Commit = strings.TrimSpace(string(out))
		}
	}
	mods := map[string]string{peerModule: abs, peerModule + "/pgstore": filepath.Join(abs, "pgstore"), peerModule + "/redistore": filepath.Join(abs, "redistore")}
	for mod, dir := range mods {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err != nil || modfile.ModulePath(data) != mod {
			return "", v, fmt.Errorf("loadbench: -peer-dir %s: want the source of %s in %s (its go.mod)", peerDir, mod, dir)
		}
	}
	gomod, err := os.ReadFile(filepath.Join(b.root, "go.mod"))
	if err != nil {
		return "", v, err
	}
	f, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return "", v, err
	}
	err = f.AddModuleStmt("loadbench.peer/abserver")
	for mod, dir := range mods {
		if err == nil {
			err = f.AddRequire(mod, "v0.0.0")
		}
		if err == nil {
			err = f.AddReplace(mod, "", dir, "")
		}
	}
	var out []byte
	if err == nil {
		out, err = f.Format()
	}
	if err != nil {
		return "", v, fmt.Errorf("loadbench: the peer's go.mod: %w", err)
	}
	src := filepath.Join(b.dir, "peer")
	sum, err := os.ReadFile(filepath.Join(b.root, "go.sum"))
	if err == nil {
		err = writeFile(filepath.Join(src, "go.mod"), bytes.NewReader(out), 0o644)
	}
	if err == nil {
		err = writeFile(filepath.Join(src, "go.sum"), bytes.NewReader(sum), 0o644)
	}
	files, ferr := b.serverFiles()
	if err == nil {
		err = ferr
	}
	for _, name := range files {
		if err != nil {
			break
		}
		from, to := name, name
		if name == idemFile {
			from = peerFile
		}
		var code []byte
		if code, err = os.ReadFile(filepath.Join(b.root, abserverDir, from)); err == nil {
			code = bytes.Replace(code, []byte("//go:build ignore\n"), nil, 1)
			err = writeFile(filepath.Join(src, to), bytes.NewReader(code), 0o644)
		}
	}
	if err != nil {
		return "", v, fmt.Errorf("loadbench: the peer's server: %w", err)
	}
	bin := filepath.Join(b.dir, "bin", "peer")
	if err := b.goBuild(src, ".", bin, "GOFLAGS="+os.Getenv("GOFLAGS")+" -mod=mod", "GOPROXY=off", "GOSUMDB=off"); err != nil {
		return "", v, fmt.Errorf("loadbench: building the peer's server: %w", err)
	}
	return bin, v, nil
}
