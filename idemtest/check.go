package idemtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
)

// Check runs the checks against the target, one after another, and reports
// every outcome; it stops early only when ctx ends. Each check uses fresh
// keys of its own (replay repeats first-request's), so that the checks are
// independent of earlier runs against the same target. A check that needs
// what another learns runs it first, unreported, when it was not asked for
// (see [Target.Checks]).
//
// The error is for a target that cannot be checked: a Target that is not
// valid (no URL, a malformed one, an invalid header, an unknown check name),
// with a nil report; a URL whose host cannot be reached, an error wrapping
// ErrUnreachable, with a nil report; or the end of ctx, in which case the
// report holds the checks that ran. A target that breaks the protocol is not
// an error: see [Report.Err].
func Check(ctx context.Context, target Target) (*Report, error) {
	t, err := target.withDefaults()
	if err != nil {
		return nil, err
	}
	base := t.URL
	if t.Handler != nil {
		srv, err := serve(t.Handler)
		if err != nil {
			return nil, err
		}
		defer func() {
			srv.CloseClientConnections()
			srv.Close()
		}()
		base = srv.URL
	}
	r, err := newRunner(ctx, t, base)
	if err != nil {
		return nil, err
	}
	defer r.close()

	report := &Report{Target: r.endpoint, Policy: Policy{
		KeysOptional: t.KeysOptional,
		KeyForm:      t.KeyForm,
		MaxKeyLen:    t.MaxKeyLen,
		MinKeyLen:    t.MinKeyLen,
		KeyAlphabet:  t.KeyAlphabet,
		Release5xx:   t.Require5xxRelease,
	}}
	if t.Handler == nil {
		if err := r.reach(); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return report, fmt.Errorf("idemtest: %w", ctxErr)
			}
			return nil, err
		}
	}
	ran := map[string]bool{}
	var firstFailed bool
	// run runs c, and first, unreported, the checks whose evidence it
	// needs that have not run, so that a check run alone establishes its
	// own preconditions. It returns false when ctx ended.
	var run func(c check, reported bool) bool
	run = func(c check, reported bool) bool {
		for _, name := range c.needs {
			if !ran[name] && !run(byName(name), false) {
				return false
			}
		}
		ran[c.Name] = true
		if err := ctx.Err(); err != nil {
			return false
		}
		var res Result
		if c.needsSuccess && firstFailed {
			res = notApplicable("Skipped: the " + checkFirstRequest + " check failed (no request with a valid key succeeded), and this check needs the request to succeed.")
		} else {
			res = c.run(r)
			if ctx.Err() != nil {
				// The check was cut short: its result says nothing.
				return false
			}
		}
		res.Name = c.Name
		if c.Advisory && res.Status == StatusFail {
			res.Status = StatusAdvisory
		}
		if c.Name == checkFirstRequest && r.first == nil {
			firstFailed = true
		}
		if reported {
			report.Results = append(report.Results, res)
		}
		return true
	}
	for _, c := range checks() {
		if len(t.Checks) > 0 && !slices.Contains(t.Checks, c.Name) {
			continue
		}
		if !run(c, true) {
			return report, fmt.Errorf("idemtest: %w", ctx.Err())
		}
	}
	report.Notes = r.notes()
	return report, nil
}

// ErrUnreachable is wrapped by the error that Check returns for a target
// whose host cannot be reached: no connection could be opened to it.
var ErrUnreachable = errors.New("target unreachable")

// reach opens a connection to the target and closes it, so that a target
// that cannot be reached is reported once, as such, rather than by every
// check.
func (r *runner) reach() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.t.Timeout)
	defer cancel()
	conn, _, err := r.dial(ctx)
	if err != nil {
		return fmt.Errorf("idemtest: %w: %s: %w", ErrUnreachable, r.addr, err)
	}
	conn.Close()
	return nil
}

// notes says what the kit noticed about the target as a whole.
func (r *runner) notes() []string {
	var notes []string
	if r.markedWith != "" && r.markedWith != r.t.ReplayedHeader {
		notes = append(notes, "Replays are marked with "+r.markedWith+", not "+r.t.ReplayedHeader+
			": the kit recognised it (Target.ReplayedHeader, idemcheck -replay-header, names it).")
	}
	if r.ranAgain && !r.keyEffect {
		notes = append(notes, "Every request ran as if it had no key: no answer was a replay, a 409, a 422 or a refusal of a key. "+
			"The target may read the key from another header than "+r.t.KeyHeader+" (X-Idempotency-Key is a common one; "+
			"Target.KeyHeader, idemcheck -key-header, names it), or not protect this endpoint.")
	}
	return notes
}

// serve starts h on a loopback port. Unlike httptest.NewServer, it returns
// an error rather than panicking when it cannot listen.
func serve(h http.Handler) (*httptest.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("idemtest: serving the handler: %w", err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h}}
	srv.Start()
	return srv, nil
}

// tri is a fact the checks learn about the target, or do not.
type tri int8

const (
	unknown tri = iota
	yes
	no
)

func triOf(b bool) tri {
	if b {
		return yes
	}
	return no
}

// runner holds what the checks share: the target, the client, and the
// evidence that earlier checks gathered for later ones.
type runner struct {
	ctx      context.Context
	t        Target
	endpoint string // the URL requests go to
	display  string // the method and request target, for reports
	addr     string // host:port, for connections of the kit's own
	tls      *tls.Config
	client   *http.Client
	own      *http.Transport // the transport of a client of Check's own
	body     [2][]byte       // Body(0), Body(1)

	// forms are the forms of valid key the target's declarations allow,
	// and working those that the first-request check saw succeed; turn
	// picks the next one.
	forms, working []keyForm
	turn           int
	// firsts are the first-request check's requests and answers, one per
	// form; first is the first of them that succeeded.
	firsts []seen
	first  *answer
	// firstStatuses are the statuses of the first-request check's
	// answers that did not succeed.
	firstStatuses []int
	// original and replayed are the replay check's first answer and its
	// replay, if it matched.
	original, replayed *answer
	// marks: the target marks replays (the replay check saw one marked).
	marks tri
	// distinct: two executions of the request under different keys gave
	// different answers, so an answer equal to another is a replay.
	distinct tri
	// problems are the refusals seen, for the problem-json check.
	problems []seen

	// markers are the names of the headers that mark a replay:
	// Target.ReplayedHeader and its common spellings.
	markers []string
	// markedWith is the first of them seen marking a replay.
	markedWith string
	// ranAgain: the replay check's repeat ran the request again.
	ranAgain bool
	// keyEffect: some answer showed that the target reads the key: a
	// replay, 409, 422, or the refusal of a missing or malformed key.
	keyEffect bool
}

// seen is an answer that a check got, kept as evidence for another check.
type seen struct {
	check string
	q     request
	a     answer
}

func newRunner(ctx context.Context, t Target, base string) (*runner, error) {
	if t.Path != "" {
		base = strings.TrimSuffix(base, "/")
	}
	endpoint := base + t.Path
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("idemtest: %q: %w", endpoint, err)
	}
	r := &runner{
		ctx:      ctx,
		t:        t,
		endpoint: endpoint,
		display:  t.Method + " " + u.RequestURI(),
		body:     [2][]byte{t.Body(0), t.Body(1)},
		markers:  []string{t.ReplayedHeader},
		forms:    keyForms(t),
	}
	for _, name := range commonReplayHeaders {
		if name != t.ReplayedHeader {
			r.markers = append(r.markers, name)
		}
	}
	if string(r.body[0]) == string(r.body[1]) {
		return nil, fmt.Errorf("idemtest: Target.Body returns the same body for variants 0 and 1")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	r.addr = net.JoinHostPort(u.Hostname(), port)

	r.client = t.Client
	if r.client == nil {
		tr := &http.Transport{}
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			tr = dt.Clone()
		}
		tr.MaxIdleConnsPerHost = t.Concurrency
		r.own = tr
		r.client = &http.Client{
			Transport: tr,
			// The checks judge the target's own answers.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if u.Scheme == "https" {
		cfg := &tls.Config{}
		if tr, ok := r.client.Transport.(*http.Transport); ok && tr.TLSClientConfig != nil {
			cfg = tr.TLSClientConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		r.tls = cfg
	}
	return r, nil
}

func (r *runner) close() {
	if r.own != nil {
		r.own.CloseIdleConnections()
	}
}

// saw keeps a refusal as evidence for the problem-json check: the first of
// each status per check.
func (r *runner) saw(check string, q request, a answer) {
	if a.err == nil && (a.status == http.StatusConflict || a.status == http.StatusUnprocessableEntity ||
		a.status == http.StatusBadRequest && check != checkFirstRequest) {
		r.keyEffect = true
	}
	switch a.status {
	case http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity:
	default:
		return
	}
	if a.err != nil {
		return
	}
	for _, s := range r.problems {
		if s.check == check && s.a.status == a.status {
			return
		}
	}
	r.problems = append(r.problems, seen{check, q, a})
}

// refusedValid reports whether a, a refusal of a missing or malformed key,
// is also what every request with a valid key got: the refusal may then be
// for something else than the key.
func (r *runner) refusedValid(a answer) bool {
	return r.first == nil && slices.Contains(r.firstStatuses, a.status)
}

func pass(sent, got, want, detail string) Result {
	return Result{Status: StatusPass, Sent: sent, Got: got, Want: want, Detail: detail}
}

func fail(sent, got, want, detail string) Result {
	return Result{Status: StatusFail, Sent: sent, Got: got, Want: want, Detail: detail}
}

func advise(sent, got, want, detail string) Result {
	return Result{Status: StatusAdvisory, Sent: sent, Got: got, Want: want, Detail: detail}
}

func inconclusive(sent, got, want, detail string) Result {
	return Result{Status: StatusInconclusive, Sent: sent, Got: got, Want: want, Detail: detail}
}

func notApplicable(detail string) Result {
	return Result{Status: StatusNotApplicable, Detail: detail}
}
