package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// abProtocol is the version of the server program's output and control
// requests that this program speaks (abserver's protocol).
const abProtocol = 2

// serverStats are what a server program reports on /loadbench/ requests.
type serverStats struct {
	Protocol int   `json:"protocol"`
	Writes   int64 `json:"writes"`
	Bytes    int64 `json:"bytes"`
}

// serverProc is a server program running for one variant and one store.
type serverProc struct {
	cmd    *exec.Cmd
	url    string
	client *http.Client
	exited chan struct{}
	// stderr keeps the end of what the program printed, for errors.
	stderr *tailBuffer
}

// startServer starts bin with args, and env added to this process's
// environment, and waits until it says where it serves.
func startServer(ctx context.Context, client *http.Client, bin string, args, env []string) (*serverProc, error) {
	p := &serverProc{cmd: exec.Command(bin, args...), client: client, exited: make(chan struct{}), stderr: &tailBuffer{max: 4096}}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.SysProcAttr = childAttr()
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	// The first line, or none (closed) if the program ends without one.
	lines := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		} else {
			close(lines)
		}
		io.Copy(io.Discard, out)
	}()
	go func() {
		<-drained // Wait closes the pipe: the reader must be done with it
		p.cmd.Wait()
		close(p.exited)
	}()
	var line string
	select {
	case l, ok := <-lines:
		if !ok {
			<-p.exited
			return nil, fmt.Errorf("the server exited: %s", p.stderr)
		}
		line = l
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	case <-time.After(2 * time.Minute):
		p.stop()
		return nil, fmt.Errorf("the server did not say where it serves within 2 minutes: %s", p.stderr)
	}
	var r struct {
		Protocol int    `json:"protocol"`
		URL      string `json:"url"`
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil || r.URL == "" {
		p.stop()
		return nil, fmt.Errorf("the server printed %q, not where it serves", line)
	}
	if r.Protocol != abProtocol {
		p.stop()
		return nil, fmt.Errorf("the server speaks protocol %d, this program %d: its loadbench and this one are of different times", r.Protocol, abProtocol)
	}
	p.url = r.URL
	return p, nil
}

// pid returns the program's process ID.
func (p *serverProc) pid() int { return p.cmd.Process.Pid }

// control sends a request under /loadbench/ and returns the stats it
// answers with.
func (p *serverProc) control(ctx context.Context, what string, query url.Values) (serverStats, error) {
	method := http.MethodPost
	if what == "stats" {
		method = http.MethodGet
	}
	u := p.url + "/loadbench/" + what
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return serverStats{}, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return serverStats{}, fmt.Errorf("server %s: %w", what, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return serverStats{}, fmt.Errorf("server %s: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		return serverStats{}, fmt.Errorf("server %s: %s: %s", what, resp.Status, strings.TrimSpace(string(body)))
	}
	var st serverStats
	if err := json.Unmarshal(body, &st); err != nil {
		return serverStats{}, fmt.Errorf("server %s: %w", what, err)
	}
	return st, nil
}

// seed sends the request that a replay phase repeats, so that key's record
// is completed.
func (p *serverProc) seed(ctx context.Context, key string) error {
	req, err := newRequest(p.url+"/orders", key)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("seeding the replayed key: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("seeding the replayed key: status %d: %s", resp.StatusCode, body)
	}
	return nil
}

// stop kills the program and waits for it.
func (p *serverProc) stop() {
	p.cmd.Process.Kill()
	<-p.exited
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.b))
	if s == "" {
		return "(nothing on its standard error)"
	}
	return s
}

// withQuery returns URL u with the query parameters of q added.
func withQuery(u string, q map[string]string) (string, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return "", errors.New("not a valid URL")
	}
	v := pu.Query()
	for k, x := range q {
		v.Set(k, x)
	}
	pu.RawQuery = v.Encode()
	return pu.String(), nil
}
