// Command benchcount counts the instructions a benchmark spends per
// operation, with valgrind's callgrind, a number that does not move with the
// machine's load the way times do.
//
// It runs a test binary (built with go test -c) under callgrind twice per
// benchmark, at two fixed -test.benchtime counts, and divides the difference
// of the instructions executed by the difference of the counts: start-up,
// set-up and the benchmark's first, single run cancel out. The collector is
// off (GOGC=off: its work depends on timing, and allocations are counted by
// -benchmem), GOMAXPROCS is 1 and asynchronous preemption off (callgrind
// does not survive Go's preemption signals). The first benchmark named is the
// baseline of the "over" column (the mean of its runs).
//
//	go test -c -o /tmp/server.test ./server/
//	cd server && go run ../internal/cmd/benchcount -bin /tmp/server.test \
//	    'BenchmarkMiddleware/bare$' 'BenchmarkMiddleware/first-nostore$' 'BenchmarkMiddleware/replay$'
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

func main() {
	bin := flag.String("bin", "", "the test binary (go test -c)")
	n1 := flag.Int("n1", 1000, "the smaller -test.benchtime count")
	n2 := flag.Int("n2", 21000, "the larger -test.benchtime count")
	runs := flag.Int("runs", 2, "how many times to measure each benchmark")
	flag.Parse()
	if err := run(os.Stdout, *bin, *n1, *n2, *runs, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "benchcount:", err)
		os.Exit(1)
	}
}

func run(out io.Writer, bin string, n1, n2, runs int, benches []string) error {
	if bin == "" || len(benches) == 0 || n2 <= n1 || n1 < 1 || runs < 1 {
		return errors.New("usage: benchcount -bin BINARY [-n1 N] [-n2 N] [-runs R] BENCH ...: a benchmark pattern at least")
	}
	dir, err := os.MkdirTemp("", "benchcount")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(out, "instructions per operation: (Ir at %dx - Ir at %dx) / %d, %s\n\n", n2, n1, n2-n1, filepath.Base(bin))
	fmt.Fprintf(out, "| benchmark | run | instructions/op | over %s |\n|---|--:|--:|--:|\n", benches[0])
	var base float64
	for i, bench := range benches {
		for r := 1; r <= runs; r++ {
			var ir [2]int64
			for j, n := range [2]int{n1, n2} {
				if ir[j], err = count(dir, bin, bench, n); err != nil {
					return fmt.Errorf("%s at %dx: %w", bench, n, err)
				}
			}
			per := float64(ir[1]-ir[0]) / float64(n2-n1)
			over := "–"
			if i == 0 {
				base += per / float64(runs)
			} else {
				over = fmt.Sprintf("%+.0f", per-base)
			}
			fmt.Fprintf(out, "| %s | %d | %.1f | %s |\n", bench, r, per, over)
		}
	}
	return nil
}

// count runs bench n times under callgrind and returns the instructions the
// whole process executed.
func count(dir, bin, bench string, n int) (int64, error) {
	file := filepath.Join(dir, "callgrind.out")
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+file,
		bin, "-test.run", "^$", "-test.bench", bench, "-test.benchtime", strconv.Itoa(n)+"x")
	cmd.Env = append(os.Environ(), "GOGC=off", "GOMAXPROCS=1", "GODEBUG=asyncpreemptoff=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%w: %s", err, lastLines(stderr.String(), 5))
	}
	if !bytes.Contains(stdout, []byte("Benchmark")) {
		return 0, fmt.Errorf("no benchmark ran: %s", lastLines(string(stdout), 5))
	}
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return summary(f)
}

// summary reads the total instruction count from a callgrind output file.
func summary(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary:"); ok {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no summary line in callgrind's output")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
