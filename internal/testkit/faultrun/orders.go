package faultrun

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Orders is the API that the runs protect: a POST with a JSON body
// {"ref": "..."} creates an order with a new number and answers 201 with
// {"id": n, "ref": "..."}. It counts every execution by reference, which is
// the ground truth a run is judged by. It is safe for concurrent use.
type Orders struct {
	// Work is how long each execution takes, so that requests with the same
	// key overlap. Zero answers at once.
	Work time.Duration

	mu    sync.Mutex
	next  int
	execs map[string][]int // order numbers, by reference
}

// NewOrders returns an API with no orders yet.
func NewOrders() *Orders { return &Orders{execs: map[string][]int{}} }

// ServeHTTP places the order of a request.
func (o *Orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in struct{ Ref string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Ref == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	if o.Work > 0 {
		t := time.NewTimer(o.Work)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return // no answer: the middleware releases the key
		}
	}
	markRan(r.Context())
	o.mu.Lock()
	o.next++
	id := o.next
	o.execs[in.Ref] = append(o.execs[in.Ref], id)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"ref":%q}`, id, in.Ref)
}

// Executions returns the numbers of the orders made for ref, in the order
// they were made: one for an order that ran once.
func (o *Orders) Executions(ref string) []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int(nil), o.execs[ref]...)
}

// Total returns the number of executions, all references together.
func (o *Orders) Total() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next
}

// serverLog records what the middleware answered to every request that
// reached it, and whether the handler behind it ran.
type serverLog struct {
	mu     sync.Mutex
	events []serverEvent
}

type serverEvent struct {
	in, out time.Time
	status  int
	ran     bool
}

type ranKey struct{}

// markRan tells the serverLog that the handler ran for this request.
func markRan(ctx context.Context) {
	if ran, ok := ctx.Value(ranKey{}).(*bool); ok {
		*ran = true
	}
}

// wrap records the requests that h serves.
func (l *serverLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev := serverEvent{in: time.Now()}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), ranKey{}, &ev.ran)))
		ev.out, ev.status = time.Now(), sw.status
		if ev.status == 0 {
			ev.status = http.StatusOK
		}
		l.mu.Lock()
		l.events = append(l.events, ev)
		l.mu.Unlock()
	})
}

// answers counts the statuses given, with "ran" appended to those whose
// handler ran.
func (l *serverLog) answers() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]int{}
	for _, ev := range l.events {
		k := fmt.Sprint(ev.status)
		if ev.ran {
			k += " ran"
		}
		m[k]++
	}
	return m
}

// within returns the events whose request arrived in [from, to).
func (l *serverLog) within(from, to time.Time) []serverEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []serverEvent
	for _, ev := range l.events {
		if !ev.in.Before(from) && ev.in.Before(to) {
			out = append(out, ev)
		}
	}
	return out
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logCounter is a slog.Handler that counts the middleware's log records by
// message, so that a report can say how often it could not store a response
// or release a claim.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func newLogCounter() *logCounter { return &logCounter{counts: map[string]int{}} }

func (*logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.counts[r.Message]++
	l.mu.Unlock()
	return nil
}

func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

func (l *logCounter) snapshot() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]int, len(l.counts))
	for k, v := range l.counts {
		m[k] = v
	}
	return m
}
