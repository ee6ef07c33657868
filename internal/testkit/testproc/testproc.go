// Package testproc builds a server program and runs it as a child process of
// a test, so that the test can do to it what only a process allows: kill it
// with SIGKILL in the middle of its work, start it again on the same state,
// and read its resident memory from /proc.
//
// A program run this way prints one line "listening on ADDR" on its standard
// output once it accepts connections; Start waits for that line.
package testproc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Ready is what a program prints, followed by its address, when it accepts
// connections.
const Ready = "listening on "

// Build compiles the main package pkg (an import path) into a directory of
// t's and returns the binary's path. The build uses the go command on PATH.
func Build(t testing.TB, pkg string, flags ...string) string {
	t.Helper()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("testproc: the go command is needed to build %s: %v", pkg, err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append(append([]string{"build", "-o", bin}, flags...), pkg)
	if out, err := exec.CommandContext(ctx, gocmd, args...).CombinedOutput(); err != nil {
		t.Fatalf("testproc: go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// Process is a running program.
type Process struct {
	// Addr is the address the program said it listens on.
	Addr   string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *syncBuffer
}

// Start runs bin with args, its environment being the test's plus env,
// waits until it prints its address (at most a minute), and kills it when t
// ends, if it has not been killed before.
func Start(t testing.TB, bin string, args []string, env ...string) *Process {
	t.Helper()
	p, err := start(bin, args, env)
	if err != nil {
		t.Fatalf("testproc: %v", err)
	}
	t.Cleanup(p.Kill)
	return p
}

func start(bin string, args, env []string) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	log := &syncBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, exited: make(chan struct{}), log: log}
	addr := make(chan string, 1)
	go func() {
		// The pipe must be read to its end before Wait.
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, Ready); ok {
				select {
				case addr <- a:
				default:
				}
			}
			log.Write([]byte(line + "\n"))
		}
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(p.exited)
	}()
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case p.Addr = <-addr:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s exited before listening: %s\n%s", filepath.Base(bin), cmd.ProcessState, log)
	case <-timer.C:
		p.Kill()
		return nil, fmt.Errorf("%s did not say where it listens within a minute:\n%s", filepath.Base(bin), log)
	}
}

// PID returns the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Kill kills the process with SIGKILL, as a crash would end it, and waits
// until it has exited. It may be called more than once.
func (p *Process) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Output returns what the process printed, standard output and error.
func (p *Process) Output() string { return p.log.String() }

// RSS returns the process's resident set size in bytes, as Linux reports it
// (VmRSS in /proc/PID/status).
func (p *Process) RSS() (int64, error) {
	return rss(p.PID())
}

// PeakRSS returns the largest resident set size the process has had, in
// bytes (VmHWM in /proc/PID/status).
func (p *Process) PeakRSS() (int64, error) {
	return statusKB(p.PID(), "VmHWM:")
}

func rss(pid int) (int64, error) { return statusKB(pid, "VmRSS:") }

func statusKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("testproc: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("testproc: %s %q: %w", field, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("testproc: no %s in /proc/%d/status", field, pid)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Bounded: a chatty program must not fill the test's memory.
	if s.b.Len() > 1<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
