package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/engine"
)

// fingerprint is every delivery's: the delivery id, verified, names one
// event, so a retry whose body differs (a sender that re-serialises it) is
// the same delivery, never a key reused for another request.
const fingerprint = "webhook"

// Receiver receives one sender's webhooks at one endpoint: it verifies each
// delivery on its raw body before anything touches the store, then runs the
// handler once per delivery id and answers the sender as it needs. Create
// one with [New] and mount [Receiver.Handler]. Its configuration is
// immutable, and it is safe for concurrent use.
type Receiver struct {
	engine  *engine.Engine
	sender  Sender
	scope   string
	maxBody int64
	keep    func(status int) bool

	keepPanicked atomic.Bool
}

// Option configures a Receiver. New refuses an invalid one (a nil Option
// included) with an error that names every invalid option.
type Option func(*config)

type config struct {
	engine   engine.Config
	endpoint string
	keep     func(status int) bool
	bad      []error
}

// WithConfig sets the engine's settings: TTL, Lease, StoreTimeout, Wait,
// RetryAfter, Abandoned, FailOpen, Logger and Observer (see engine.Config).
// Two fields read differently here, so that a zero Config is right for the
// sender:
//
//   - TTL 0 is the sender's TTL (Sender.TTL), which outlasts its retries,
//     not the engine's 24 h.
//   - Wait 0 is the sender's wait (Sender.Wait), below its deadline. A
//     negative Wait disables waiting: a duplicate that arrives while the
//     original runs is answered 503 with Retry-After at once, and the
//     sender retries it later. Any positive Wait is used as it is.
func WithConfig(cfg engine.Config) Option {
	return func(c *config) { c.engine = cfg }
}

// WithEndpoint names the endpoint, for the scope of its records
// ("webhook/<sender>/<endpoint>"): two receivers of one sender that share a
// store must have two names, so that a delivery id sent to both (the same
// event, fanned out to two subscriptions) runs at both. It is "default"
// when not set: printable ASCII without '/', 1 to 64 bytes.
func WithEndpoint(name string) Option {
	return func(c *config) {
		if !validName(name) {
			c.bad = append(c.bad, fmt.Errorf("webhook: endpoint name %q is not 1 to 64 bytes of printable ASCII without '/'", name))
			return
		}
		c.endpoint = name
	}
}

// WithKeep sets which of the handler's statuses are kept: a kept status
// records the delivery as done, and every later duplicate is answered that
// status at once, without a body and without running the handler; any other
// releases the key, so that the sender's retry runs the handler again. By
// default only a 2xx is kept: every sender treats any other status as a
// failed delivery and retries it, and a retry must then run. A panic in keep
// is recovered and logged once; the default decides instead.
func WithKeep(keep func(status int) bool) Option {
	return func(c *config) {
		if keep == nil {
			c.bad = append(c.bad, errors.New("webhook: WithKeep needs a function"))
			return
		}
		c.keep = keep
	}
}

// keep2xx is the default of WithKeep.
func keep2xx(status int) bool { return status >= 200 && status < 300 }

// New returns a Receiver of sender's deliveries that keeps its records in
// store. Give a preset with its secrets (webhook.Stripe("whsec_...")) or a
// Sender of your own. The sender and the options are checked: the error
// names every invalid one. A nil store is refused.
func New(store engine.Store, sender Sender, opts ...Option) (*Receiver, error) {
	cfg := config{endpoint: "default", keep: keep2xx}
	for i, o := range opts {
		if o == nil {
			cfg.bad = append(cfg.bad, fmt.Errorf("webhook: option %d is nil", i))
			continue
		}
		o(&cfg)
	}
	if err := sender.validate(); err != nil {
		cfg.bad = append(cfg.bad, err)
	}
	if err := errors.Join(cfg.bad...); err != nil {
		return nil, err
	}
	ec := cfg.engine
	if ec.TTL == 0 {
		ec.TTL = sender.TTL
	}
	switch {
	case ec.Wait == 0:
		ec.Wait = sender.Wait
	case ec.Wait < 0:
		ec.Wait = 0
	}
	e, err := engine.New(store, ec)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	maxBody := sender.MaxBody
	if maxBody == 0 {
		maxBody = defaultMaxBody
	}
	return &Receiver{
		engine: e, sender: sender, maxBody: maxBody, keep: cfg.keep,
		scope: "webhook/" + sender.Name + "/" + cfg.endpoint,
	}, nil
}

// Handler wraps next, the handler of verified deliveries. It answers:
//
//   - a method other than POST: 405; a body over the sender's MaxBody: 413;
//     a delivery the sender's Verify or ID refuses: 400 (ErrMalformed) or
//     401 (ErrUnverified, any other error). Nothing is claimed or stored
//     for them: a flood of forged requests writes no record.
//   - the first delivery of an id: next runs, with the body, under a lease
//     (engine.LeaseFromContext; an idempotency.Client in it derives its
//     keys from the delivery id). A kept status (2xx by default) is stored,
//     then next's answer goes to the sender; any other status releases the
//     key and goes to the sender as it is, so that its retry runs next
//     again. A panic in next releases the key, and goes on; so does a
//     status code outside 100-999 (on which net/http panics), answered 500.
//   - a delivery whose id is done: its kept status at once, with
//     Idempotent-Replayed: true and no body; next does not run.
//   - a delivery whose id is in flight: it waits (Sender.Wait, or
//     engine.Config.Wait) for the original's answer and gets it; if the
//     original is still running after that, 503 with Retry-After, and the
//     sender retries.
//   - the store failing: 503 with Retry-After; next does not run (unless
//     engine.Config.FailOpen).
//
// No answer of the door's own is a 409: senders count any non-2xx as a
// failed delivery, and some disable an endpoint after a few.
func (rc *Receiver) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.serve(w, r, next)
	})
}

// Shutdown waits for the records that are being stored after their answer
// went out (a store that was too slow when the handler returned), or until
// ctx ends; see engine.Engine.Shutdown. Call it after the HTTP server has
// shut down.
func (rc *Receiver) Shutdown(ctx context.Context) error {
	if err := rc.engine.Shutdown(ctx); err != nil {
		return fmt.Errorf("webhook: shutdown: %w", err)
	}
	return nil
}

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	start := time.Now()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		rc.reject(w, r, start, "", http.StatusMethodNotAllowed, errors.New("webhook: method "+r.Method+" is not POST"))
		return
	}
	body, err := rc.readBody(r)
	if err != nil {
		status := http.StatusBadRequest
		var tooLarge *http.MaxBytesError
		if errors.Is(err, errTooLarge) || errors.As(err, &tooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		rc.reject(w, r, start, "", status, err)
		return
	}
	if err := rc.sender.Verify(r, body, time.Now()); err != nil {
		rc.reject(w, r, start, "", refusal(err), err)
		return
	}
	id, err := rc.sender.ID(r, body)
	if err == nil {
		err = checkID(id)
	}
	if err != nil {
		rc.reject(w, r, start, "", http.StatusBadRequest, err)
		return
	}
	d := &delivery{rc: rc, w: w, r: r, next: next, body: body}
	d.call.Start = start
	rc.engine.Do(r.Context(), &d.call, engine.ID{Scope: rc.scope, Key: id}, fingerprint, d)
}

// refusal is the status of a delivery that Verify refused with err.
func refusal(err error) int {
	if errors.Is(err, ErrMalformed) {
		return http.StatusBadRequest
	}
	return http.StatusUnauthorized
}

// reject answers a request refused before any claim, and tells the
// observer. The error, which may say why a signature failed, is not sent.
func (rc *Receiver) reject(w http.ResponseWriter, r *http.Request, start time.Time, key string, status int, err error) {
	http.Error(w, http.StatusText(status), status)
	rc.engine.Observe(r.Context(), engine.Event{Kind: engine.EventRejected, Scope: rc.scope, Key: key, Status: status, Start: start, Err: err})
}

var errTooLarge = errors.New("webhook: body too large")

// readBody reads the whole body, refusing it past the sender's MaxBody. Its
// buffer grows as bytes arrive, so that a declared length reserves nothing.
func (rc *Receiver) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > rc.maxBody {
		return nil, fmt.Errorf("%w: %d bytes declared, at most %d", errTooLarge, r.ContentLength, rc.maxBody)
	}
	// One byte past the limit tells a longer body; the largest limit has
	// no byte past it.
	limit := rc.maxBody
	if limit < math.MaxInt64 {
		limit++
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("webhook: read body: %w", err)
	}
	if int64(len(body)) > rc.maxBody {
		return nil, fmt.Errorf("%w: more than %d bytes", errTooLarge, rc.maxBody)
	}
	return body, nil
}

// kept reports whether the handler's status is kept, by WithKeep's
// function; a panic in it is recovered, logged once, and the default
// decides. It runs while the key is held.
func (rc *Receiver) kept(ctx context.Context, status int) (keep bool) {
	defer func() {
		if v := recover(); v != nil {
			if !rc.keepPanicked.Swap(true) {
				rc.engine.Logger().LogAttrs(ctx, slog.LevelError, "webhook: keep function panicked; 2xx decides instead, and its panics are not logged again",
					slog.Int("status", status), slog.String("panic", fmt.Sprint(v)))
			}
			keep = keep2xx(status)
		}
	}()
	return rc.keep(status)
}

// retryAfter is a Retry-After value: whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++ // d + time.Second - 1 would overflow near math.MaxInt64
	}
	return strconv.FormatInt(max(s, 1), 10)
}
