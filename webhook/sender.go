package webhook

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ErrMalformed is what a Sender's Verify or ID returns, wrapped, for a
// request that does not have the shape of the sender's deliveries: a
// signature, timestamp or id header missing or unparsable, a body without
// its event id. The receiver answers it 400, before anything touches the
// store.
var ErrMalformed = errors.New("webhook: malformed delivery")

// ErrUnverified is what a Sender's Verify returns, wrapped, for a delivery
// whose signature does not match any of the receiver's secrets, or whose
// signed timestamp is outside the sender's tolerance (a replayed or forged
// request). The receiver answers it 401, before anything touches the store.
// Verify may return any other error too: the receiver answers it 401 as
// well.
var ErrUnverified = errors.New("webhook: delivery not verified")

// defaultMaxBody is the largest request body a Sender reads when its
// MaxBody is 0: 1 MiB, fifty times the 20 KB the Standard Webhooks
// specification recommends a payload stay under.
const defaultMaxBody = 1 << 20

// maxIDLen is the longest delivery id accepted, as the HTTP middleware
// accepts for an Idempotency-Key; a longer one is refused as malformed.
const maxIDLen = 255

// Sender says how one sender signs its deliveries and where their id is,
// and how long its retries go on: the presets (StandardWebhooks, Stripe,
// GitHub, Shopify, GitLab) return one, and a Sender of one's own declares
// any other. Verify and ID are required; a zero TTL, Wait or MaxBody takes
// the receiver's default.
type Sender struct {
	// Name names the sender in the scope of its records
	// ("webhook/<Name>/<endpoint>"): printable ASCII without '/', 1 to 64
	// bytes.
	Name string
	// Verify checks that r is the sender's delivery, from the raw body
	// read before it is called (r.Body is spent): its signature over the
	// body with one of the receiver's secrets, its signed timestamp within
	// the sender's tolerance of now. It returns nil, or an error wrapping
	// ErrMalformed or ErrUnverified. It must compare secrets and
	// signatures in constant time, and never put a secret in its error.
	Verify func(r *http.Request, body []byte, now time.Time) error
	// ID returns the delivery id of a verified delivery: the same for
	// every retry of one event, and never the same for two events. It
	// returns an error wrapping ErrMalformed when there is none.
	ID func(r *http.Request, body []byte) (string, error)
	// TTL is how long a delivery's record is kept, when the receiver's
	// engine.Config.TTL is 0: at least as long as the sender goes on
	// retrying, so that a late retry is still known. 0 is
	// the engine's default, 24 h.
	TTL time.Duration
	// Wait is how long a duplicate that arrives while the original runs
	// waits for its answer, when the receiver's engine.Config.Wait is 0:
	// below the sender's deadline for an answer, so that the duplicate is
	// answered before the sender gives up on it.
	Wait time.Duration
	// MaxBody is the largest body read; a longer one is refused with 413
	// before it is verified. 0 is 1 MiB.
	MaxBody int64

	err error // a preset's invalid secret, reported by New
}

// validName reports whether s can name a sender or an endpoint in a scope.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '/' {
			return false
		}
	}
	return true
}

func (s Sender) validate() error {
	var bad []error
	if s.err != nil {
		bad = append(bad, s.err)
	}
	if !validName(s.Name) {
		bad = append(bad, fmt.Errorf("webhook: sender name %q is not 1 to 64 bytes of printable ASCII without '/'", s.Name))
	}
	if s.Verify == nil {
		bad = append(bad, errors.New("webhook: sender has no Verify function"))
	}
	if s.ID == nil {
		bad = append(bad, errors.New("webhook: sender has no ID function"))
	}
	if s.TTL < 0 {
		bad = append(bad, fmt.Errorf("webhook: sender TTL %v is negative", s.TTL))
	}
	if s.Wait < 0 {
		bad = append(bad, fmt.Errorf("webhook: sender wait %v is negative", s.Wait))
	}
	if s.MaxBody < 0 {
		bad = append(bad, fmt.Errorf("webhook: sender MaxBody %d is negative", s.MaxBody))
	}
	return errors.Join(bad...)
}

// checkID refuses a delivery id that no store should key: empty, too long,
// or holding control characters.
func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty delivery id", ErrMalformed)
	}
	if len(id) > maxIDLen {
		return fmt.Errorf("%w: delivery id of %d bytes, more than %d", ErrMalformed, len(id), maxIDLen)
	}
	if strings.ContainsFunc(id, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("%w: delivery id holds a control character", ErrMalformed)
	}
	return nil
}
