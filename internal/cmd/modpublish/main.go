// Command modpublish writes modules of the repository, as the go command
// downloads them at a version, into a directory that GOPROXY can name as
// file://DIR. CI then builds a module that requires them from there, as a
// user does after a release, with the README's go get lines.
//
//	go run ./internal/cmd/modpublish -o /tmp/proxy -version v0.1.0 . idemotel
//
// A module's files are those git would commit: tracked ones, and untracked
// ones that are not ignored. A build output lying in the work tree never
// reaches the zip; an uncommitted change does, so that CI checks the tree
// it runs on. Files of nested modules are left out, as the go command
// leaves them out.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	out := flag.String("o", "", "the proxy directory to write into (required)")
	version := flag.String("version", "", "the version to publish the modules at, such as v0.1.0 (required)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: modpublish -o DIR -version VERSION MODULE_DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*out, *version, flag.Args(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "modpublish:", err)
		os.Exit(1)
	}
}

func run(out, version string, dirs []string, log io.Writer) error {
	var errs []error
	if out == "" {
		errs = append(errs, errors.New("-o is required"))
	}
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		errs = append(errs, fmt.Errorf("-version %q is not a canonical semantic version (v1.2.3)", version))
	}
	if len(dirs) == 0 {
		errs = append(errs, errors.New("no module directory given"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, dir := range dirs {
		if err := publish(out, version, dir, log); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	return nil
}

// publish writes the module in dir at version into the proxy directory out:
// its zip, go.mod, info and version list.
func publish(out, version, dir string, log io.Writer) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	m := module.Version{Path: modfile.ModulePath(gomod), Version: version}
	if m.Path == "" {
		return errors.New("go.mod has no module line")
	}
	if err := module.Check(m.Path, m.Version); err != nil {
		return err
	}
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(m.Version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}

	files, err := gitFiles(dir)
	if err != nil {
		return err
	}
	zipPath := filepath.Join(vdir, escVersion+".zip")
	if err := writeZip(zipPath, m, files); err != nil {
		return err
	}
	checked, err := zip.CheckZip(m, zipPath)
	if err != nil {
		return err
	}
	fi, err := os.Stat(zipPath)
	if err != nil {
		return err
	}

	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, escVersion+".mod"), gomod, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, escVersion+".info"), info, 0o644); err != nil {
		return err
	}
	if err := addToList(filepath.Join(vdir, "list"), m.Version); err != nil {
		return err
	}
	fmt.Fprintf(log, "%s@%s: %d files, %d bytes zipped\n", m.Path, m.Version, len(checked.Valid), fi.Size())
	return nil
}

func writeZip(name string, m module.Version, files []zip.File) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := zip.Create(f, m, files); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// addToList adds version to the proxy's list of the module's versions,
// once.
func addToList(name, version string) error {
	data, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(data))
	if slices.Contains(versions, version) {
		return nil
	}
	versions = append(versions, version)
	return os.WriteFile(name, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// gitFiles returns the files under dir that git would commit.
func gitFiles(dir string) ([]zip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []zip.File
	for name := range strings.SplitSeq(string(out), "\x00") {
		if name == "" {
			continue
		}
		path := filepath.Join(dir, filepath.FromSlash(name))
		info, err := os.Lstat(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			return nil, err
		}
		files = append(files, file{name: name, path: path, info: info})
	}
	return files, nil
}

// file is one file of a module's zip.
type file struct {
	name, path string
	info       os.FileInfo
}

func (f file) Path() string                 { return f.name }
func (f file) Lstat() (os.FileInfo, error)  { return f.info, nil }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.path) }
