package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// selfCPU returns the CPU time, user and system, that this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU adds up the CPU time of other processes, every thread of each,
// from /proc/<pid>/task/<tid>/schedstat: nanoseconds, where /proc/<pid>/stat
// counts in ticks of 10 ms, too coarse for a few seconds of a few processes.
// A process that has gone keeps the time last read for it, so that a
// closed connection's backend does not make the sum go back.
type procCPU struct {
	mu   sync.Mutex
	pids map[int]time.Duration
}

func newProcCPU() *procCPU { return &procCPU{pids: map[int]time.Duration{}} }

// add counts pid from now on.
func (p *procCPU) add(pid int) {
	t, _ := readProcCPU(pid)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pids[pid]; !ok {
		p.pids[pid] = t
	}
}

// total returns the time used by the processes counted, and false if none
// of them could be read.
func (p *procCPU) total() (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var sum time.Duration
	read := false
	for pid, last := range p.pids {
		if t, ok := readProcCPU(pid); ok && t >= last {
			p.pids[pid] = t
			read = true
		}
		sum += p.pids[pid]
	}
	return sum, read
}

// readProcCPU returns the time pid's threads have run.
func readProcCPU(pid int) (time.Duration, bool) {
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that ended
		}
		first, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
		ns, err := strconv.ParseInt(first, 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, true
}
