package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The presets' retry windows, deadlines and tolerances, each from the
// sender's own documentation (cited where the preset is defined).
const (
	// standardTolerance is the Standard Webhooks reference libraries'
	// timestamp tolerance, both ways: 5 minutes.
	standardTolerance = 5 * time.Minute
	// stripeTolerance is stripe-go's webhook.DefaultTolerance: 300 s,
	// for timestamps in the past only.
	stripeTolerance = 300 * time.Second
	// fourDays outlasts a retry schedule of three days (Stripe live mode;
	// Standard Webhooks' example schedule ends at 75 h 35 min 5 s; GitHub
	// redelivers deliveries of the past 3 days on request).
	fourDays = 96 * time.Hour
)

// StandardWebhooks returns the Sender for the Standard Webhooks
// specification, and for Svix, which wrote it: the delivery id in
// webhook-id, an HMAC-SHA256 signature of "{id}.{timestamp}.{body}" in
// webhook-signature, as a space-separated list of "v1,<base64>" entries so
// that the sender can sign with an old and a new key while it rotates, and
// the Unix timestamp in webhook-timestamp, refused when more than 5 minutes
// from now either way. A request without webhook-id is read from Svix's
// svix-id, svix-timestamp and svix-signature headers instead.
//
// Each secret is the endpoint's signing secret as the sender shows it:
// "whsec_" followed by the key in base64 (the prefix is optional). Give
// several while the receiver rotates its own secret: a delivery is verified
// when any of them signed it.
//
// Records are kept 4 days: the specification's example retry schedule
// (immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h) ends 75
// h 35 min 5 s after the first attempt; Svix's own (to 10 h + 10 h) ends
// sooner. A duplicate of a delivery in flight waits up to 12 s for its
// answer: the specification recommends a request timeout of 15 to 30 s,
// and Svix waits 15 s.
//
// Sources: the specification, github.com/standard-webhooks/standard-webhooks
// spec/standard-webhooks.md (signature scheme, headers, "Deliverability and
// reliability", "Request timeouts"); its Go library,
// libraries/go/webhook.go (tolerance, whsec_ secrets); docs.svix.com/retries
// (schedule, 15 s).
func StandardWebhooks(secrets ...string) Sender {
	s := Sender{Name: "standard-webhooks", TTL: fourDays, Wait: 12 * time.Second}
	var keys [][]byte
	for i, secret := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		if err != nil || len(key) == 0 {
			s.err = errors.Join(s.err, fmt.Errorf("webhook: Standard Webhooks secret %d is not \"whsec_\" followed by a key in base64", i))
			continue
		}
		keys = append(keys, key)
	}
	if len(secrets) == 0 {
		s.err = errors.New("webhook: StandardWebhooks needs a secret")
	}
	names := func(h http.Header) (id, ts, sig string) {
		if h.Get("Webhook-Id") != "" {
			return h.Get("Webhook-Id"), h.Get("Webhook-Timestamp"), h.Get("Webhook-Signature")
		}
		return h.Get("Svix-Id"), h.Get("Svix-Timestamp"), h.Get("Svix-Signature")
	}
	s.Verify = func(r *http.Request, body []byte, now time.Time) error {
		id, ts, sig := names(r.Header)
		if id == "" || ts == "" || sig == "" {
			return fmt.Errorf("%w: webhook-id, webhook-timestamp or webhook-signature missing", ErrMalformed)
		}
		unix, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return fmt.Errorf("%w: webhook-timestamp is not a Unix time", ErrMalformed)
		}
		at := time.Unix(unix, 0)
		if now.Sub(at) > standardTolerance || at.Sub(now) > standardTolerance {
			return fmt.Errorf("%w: webhook-timestamp more than %v from now", ErrUnverified, standardTolerance)
		}
		// As the reference library signs: the timestamp as the integer
		// it parses to, not as sent.
		signed := make([]byte, 0, len(id)+len(body)+24)
		signed = append(signed, id...)
		signed = append(signed, '.')
		signed = strconv.AppendInt(signed, unix, 10)
		signed = append(signed, '.')
		signed = append(signed, body...)
		for _, key := range keys {
			mac := hmac.New(sha256.New, key)
			mac.Write(signed)
			want := []byte("v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)))
			for _, got := range strings.Split(sig, " ") {
				if hmac.Equal([]byte(got), want) {
					return nil
				}
			}
		}
		return fmt.Errorf("%w: no webhook-signature entry matches a secret", ErrUnverified)
	}
	s.ID = func(r *http.Request, _ []byte) (string, error) {
		id, _, _ := names(r.Header)
		return id, checkID(id)
	}
	return s
}

// Stripe returns the Sender for Stripe: the Stripe-Signature header
// "t=<unix>,v1=<hex>[,v1=<hex>...]" carries an HMAC-SHA256 of
// "{t}.{body}" keyed with the endpoint's signing secret ("whsec_...", used
// as it is, not decoded); several v1 entries come while a secret is rolled.
// A timestamp more than 300 s old is refused (stripe-go's
// webhook.DefaultTolerance; like stripe-go, a timestamp in the future is
// not). The delivery id is the event's "id" in the JSON body: Stripe's
// retries resend the same event.
//
// Records are kept 4 days: in live mode Stripe retries a delivery for up
// to three days, with an exponential back-off. A duplicate of a delivery in
// flight waits up to 8 s for its answer: Stripe asks for a quick 2xx
// without stating its timeout, and 8 s stays below the 10 s of GitHub and
// GitLab.
//
// Sources: docs.stripe.com/webhooks ("Retry behavior", "Verify webhook
// signatures"); stripe-go v82 webhook/client.go (header format, tolerance,
// rolled secrets).
func Stripe(secrets ...string) Sender {
	s := Sender{Name: "stripe", TTL: fourDays, Wait: 8 * time.Second}
	s.err = needSecrets("Stripe", secrets)
	s.Verify = func(r *http.Request, body []byte, now time.Time) error {
		header := r.Header.Get("Stripe-Signature")
		if header == "" {
			return fmt.Errorf("%w: Stripe-Signature missing", ErrMalformed)
		}
		var at time.Time
		var sigs [][]byte
		for _, pair := range strings.Split(header, ",") {
			k, v, ok := strings.Cut(pair, "=")
			if !ok || strings.Contains(v, "=") {
				return fmt.Errorf("%w: Stripe-Signature is not a list of key=value", ErrMalformed)
			}
			switch k {
			case "t":
				unix, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return fmt.Errorf("%w: Stripe-Signature timestamp is not a Unix time", ErrMalformed)
				}
				at = time.Unix(unix, 0)
			case "v1":
				if sig, err := hex.DecodeString(v); err == nil {
					sigs = append(sigs, sig)
				}
			}
		}
		if len(sigs) == 0 {
			return fmt.Errorf("%w: Stripe-Signature has no v1 signature", ErrUnverified)
		}
		if now.Sub(at) > stripeTolerance {
			return fmt.Errorf("%w: Stripe-Signature timestamp older than %v", ErrUnverified, stripeTolerance)
		}
		for _, secret := range secrets {
			mac := hmac.New(sha256.New, []byte(secret))
			mac.Write(strconv.AppendInt(nil, at.Unix(), 10))
			mac.Write([]byte{'.'})
			mac.Write(body)
			want := mac.Sum(nil)
			for _, sig := range sigs {
				if hmac.Equal(sig, want) {
					return nil
				}
			}
		}
		return fmt.Errorf("%w: no Stripe-Signature v1 entry matches a secret", ErrUnverified)
	}
	s.ID = func(_ *http.Request, body []byte) (string, error) {
		var event struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(body, &event); err != nil {
			return "", fmt.Errorf("%w: body is not a JSON event", ErrMalformed)
		}
		return event.ID, checkID(event.ID)
	}
	return s
}

// GitHub returns the Sender for GitHub: X-Hub-Signature-256 is "sha256="
// followed by the hex HMAC-SHA256 of the body keyed with the webhook's
// secret, and X-GitHub-Delivery is the delivery's GUID, which a
// redelivery keeps. GitHub signs the body only, neither a timestamp nor
// X-GitHub-Delivery, so a captured delivery cannot be told from a
// redelivery: resent under its own id within the TTL it is answered from
// its record, but resent after the TTL, or at once under another id, it
// runs again. A handler whose effect must not repeat for such a resend
// keys it on the event in the body as well.
//
// GitHub does not retry a failed delivery by itself: it is redelivered only
// when someone asks (in the settings, or through the REST API), for
// deliveries of the past 3 days. Records are kept 4 days, so that such a
// redelivery of a delivery that had succeeded does not run again. A
// duplicate of a delivery in flight waits up to 8 s for its answer: GitHub
// records a delivery not answered within 10 seconds as failed. Bodies up to
// 25 MB are read, GitHub's cap on a payload.
//
// Sources: docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries;
// .../handling-failed-webhook-deliveries ("GitHub does not automatically
// redeliver failed deliveries"); .../best-practices-for-using-webhooks
// (respond within 10 seconds; X-GitHub-Delivery); webhook-events-and-payloads
// (payload cap 25 MB).
func GitHub(secrets ...string) Sender {
	s := Sender{Name: "github", TTL: fourDays, Wait: 8 * time.Second, MaxBody: 25 << 20}
	s.err = needSecrets("GitHub", secrets)
	s.Verify = func(r *http.Request, body []byte, _ time.Time) error {
		hexSig, ok := strings.CutPrefix(r.Header.Get("X-Hub-Signature-256"), "sha256=")
		if !ok {
			return fmt.Errorf("%w: X-Hub-Signature-256 missing", ErrMalformed)
		}
		sig, err := hex.DecodeString(hexSig)
		if err != nil {
			return fmt.Errorf("%w: X-Hub-Signature-256 is not hex", ErrMalformed)
		}
		if !anyMAC(secrets, body, sig) {
			return fmt.Errorf("%w: X-Hub-Signature-256 matches no secret", ErrUnverified)
		}
		return nil
	}
	s.ID = headerID("X-GitHub-Delivery")
	return s
}

// Shopify returns the Sender for Shopify: X-Shopify-Hmac-Sha256 is the
// base64 HMAC-SHA256 of the body keyed with the app's client secret, and
// X-Shopify-Event-Id is the event's id, the same on every delivery of it.
// Shopify signs the body only, neither a timestamp nor X-Shopify-Event-Id:
// a captured delivery resent after the TTL, or at once under another event
// id, runs again, as for GitHub.
//
// Shopify retries a delivery 8 times over 4 hours, and removes a
// subscription made through the Admin API after 8 consecutive failures; it
// waits 5 seconds for an answer. Records are kept 24 hours, and a duplicate
// of a delivery in flight waits up to 4 s for its answer.
//
// Sources: shopify.dev/docs/apps/build/webhooks/ignore-duplicates
// (X-Shopify-Event-Id); shopify.dev/changelog/updates-to-webhook-retry-mechanism
// (8 times over 4 hours); shopify.dev/docs/apps/build/webhooks (HMAC,
// 5-second timeout, removal after consecutive failures).
func Shopify(secrets ...string) Sender {
	s := Sender{Name: "shopify", TTL: 24 * time.Hour, Wait: 4 * time.Second}
	s.err = needSecrets("Shopify", secrets)
	s.Verify = func(r *http.Request, body []byte, _ time.Time) error {
		b64 := r.Header.Get("X-Shopify-Hmac-Sha256")
		if b64 == "" {
			return fmt.Errorf("%w: X-Shopify-Hmac-Sha256 missing", ErrMalformed)
		}
		sig, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return fmt.Errorf("%w: X-Shopify-Hmac-Sha256 is not base64", ErrMalformed)
		}
		if !anyMAC(secrets, body, sig) {
			return fmt.Errorf("%w: X-Shopify-Hmac-Sha256 matches no secret", ErrUnverified)
		}
		return nil
	}
	s.ID = headerID("X-Shopify-Event-Id")
	return s
}

// GitLab returns the Sender for GitLab: the webhook's secret token comes as
// it is in X-Gitlab-Token, compared in constant time (GitLab signs
// nothing: the token proves the sender, not the body), and Idempotency-Key
// is the delivery's id, the same on GitLab's retries and on a resend by
// hand. A GitLab that sends no Idempotency-Key is refused as malformed.
//
// GitLab.com times out a webhook after 10 seconds, and disables one that
// fails 4 times in a row (for a while, then for good after 40); it states
// no retry schedule. Records are kept 4 days, as for Stripe, so that a
// resend by hand after a long weekend is still known; a duplicate of a
// delivery in flight waits up to 8 s for its answer.
//
// Sources: docs.gitlab.com/user/project/integrations/webhooks ("Delivery
// headers": Idempotency-Key, X-Gitlab-Token; failing webhooks);
// docs.gitlab.com/user/gitlab_com (webhook timeout);
// gitlab.com/gitlab-org/gitlab merge request 160952 (Idempotency-Key kept
// across retries and resends).
func GitLab(tokens ...string) Sender {
	s := Sender{Name: "gitlab", TTL: fourDays, Wait: 8 * time.Second}
	s.err = needSecrets("GitLab", tokens)
	sums := make([][32]byte, len(tokens))
	for i, t := range tokens {
		sums[i] = sha256.Sum256([]byte(t))
	}
	s.Verify = func(r *http.Request, _ []byte, _ time.Time) error {
		got, ok := r.Header["X-Gitlab-Token"]
		if !ok || len(got) != 1 {
			return fmt.Errorf("%w: X-Gitlab-Token missing", ErrMalformed)
		}
		// Compared as digests, so that neither the length nor the bytes
		// of a token leak through the time a comparison takes.
		sum := sha256.Sum256([]byte(got[0]))
		match := 0
		for i := range sums {
			match |= subtle.ConstantTimeCompare(sum[:], sums[i][:])
		}
		if match != 1 {
			return fmt.Errorf("%w: X-Gitlab-Token matches no token", ErrUnverified)
		}
		return nil
	}
	s.ID = headerID("Idempotency-Key")
	return s
}

// needSecrets refuses a preset without a secret, or with an empty one.
func needSecrets(sender string, secrets []string) error {
	if len(secrets) == 0 {
		return fmt.Errorf("webhook: %s needs a secret", sender)
	}
	for i, s := range secrets {
		if s == "" {
			return fmt.Errorf("webhook: %s secret %d is empty", sender, i)
		}
	}
	return nil
}

// anyMAC reports whether sig is the HMAC-SHA256 of body under one of the
// secrets, comparing in constant time.
func anyMAC(secrets []string, body, sig []byte) bool {
	ok := false
	for _, secret := range secrets {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write(body)
		if hmac.Equal(mac.Sum(nil), sig) {
			ok = true
		}
	}
	return ok
}

// headerID returns an ID function that reads the delivery id from header.
func headerID(header string) func(*http.Request, []byte) (string, error) {
	return func(r *http.Request, _ []byte) (string, error) {
		vs := r.Header.Values(header)
		if len(vs) != 1 {
			return "", fmt.Errorf("%w: %s missing or repeated", ErrMalformed, header)
		}
		return vs[0], checkID(vs[0])
	}
}
