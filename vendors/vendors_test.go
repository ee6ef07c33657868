package vendors_test

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/internal/testkit/clienttest"
	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/vendors"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// A vendor is one API: its Dialect, a fake server written from its
// published behaviour, and what the Client must report of it.
type vendor struct {
	name    string
	dialect func() idempotency.Dialect
	fake    func() *fake
	// header is where the key goes.
	header string
	// marked: the API marks a replay; honoured: its answers show that it
	// took the key.
	marked, honoured bool
	// mismatch: the API refuses a changed payload; inFlight: it answers
	// while the first request runs, and wait is the wait it asks for.
	mismatch, inFlight bool
	wait               time.Duration
	// tooLong is a key outside its limits.
	tooLong string
}

var telnyxKey = regexp.MustCompile(`^[A-Za-z0-9_:-]{1,255}$`)

func maxLen(n int) func(string) bool { return func(k string) bool { return len(k) <= n } }

var vendorCases = []vendor{
	{
		// https://docs.stripe.com/api/idempotent_requests: up to 255
		// characters; a replay marked Idempotent-Replayed: true; other
		// parameters refused with an idempotency_error; 409
		// idempotency_key_in_use while the first request executes.
		name: "Stripe", dialect: vendors.Stripe, header: "Idempotency-Key",
		marked: true, honoured: true, mismatch: true, inFlight: true,
		tooLong: strings.Repeat("k", 256),
		fake: func() *fake {
			return &fake{
				header: "Idempotency-Key", valid: maxLen(255),
				decorate: func(h http.Header, _ string, _ time.Time, repeat bool) {
					if repeat {
						h.Set("Idempotent-Replayed", "true")
					}
				},
				mismatch: func(w http.ResponseWriter) {
					jsonError(w, 400, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`)
				},
				inFlight: func(w http.ResponseWriter, _ time.Time) {
					jsonError(w, 409, `{"error":{"type":"idempotency_error","code":"idempotency_key_in_use","message":"There is currently another in-progress request using this Idempotent Key."}}`)
				},
			}
		},
	},
	{
		// https://docs.adyen.com/development-resources/api-idempotency: up
		// to 64 characters; the key returned in the response's
		// Idempotency-Key header; no replay marker, refusal or in-flight
		// answer documented.
		name: "Adyen", dialect: vendors.Adyen, header: "Idempotency-Key",
		honoured: true, tooLong: strings.Repeat("k", 65),
		fake: func() *fake {
			return &fake{
				header: "Idempotency-Key", valid: maxLen(64),
				decorate: func(h http.Header, key string, _ time.Time, _ bool) { h.Set("Idempotency-Key", key) },
			}
		},
	},
	{
		// https://developer.paypal.com/reference/guidelines/idempotency and
		// the Orders v2 reference: PayPal-Request-Id of 1 to 108
		// characters; the latest status of the first request on a retry;
		// PAYPAL_REQUEST_ID_PREVIOUSLY_USED (422) for another request.
		name: "PayPal", dialect: vendors.PayPal, header: "PayPal-Request-Id",
		mismatch: true, tooLong: strings.Repeat("k", 109),
		fake: func() *fake {
			return &fake{
				header: "PayPal-Request-Id", valid: maxLen(108),
				mismatch: func(w http.ResponseWriter) {
					jsonError(w, 422, `{"name":"UNPROCESSABLE_ENTITY","message":"The requested action could not be performed, semantically incorrect, or failed business validation.","details":[{"issue":"PAYPAL_REQUEST_ID_PREVIOUSLY_USED","description":"The PayPal-Request-Id has already been used for another request."}]}`)
				},
			}
		},
	},
	{
		// https://www.checkout.com/docs/payments/manage-payments/idempotency:
		// Cko-Idempotency-Key; the same status and body on a retry; 409
		// for concurrent requests with the key, and a wait of at least 30
		// seconds before the next.
		name: "Checkout.com", dialect: vendors.CheckoutCom, header: "Cko-Idempotency-Key",
		inFlight: true, wait: 30 * time.Second,
		fake: func() *fake {
			return &fake{
				header: "Cko-Idempotency-Key", valid: func(string) bool { return true },
				inFlight: func(w http.ResponseWriter, _ time.Time) {
					jsonError(w, 409, `{"request_id":"0HL80RJLS76I7","error_type":"request_conflict"}`)
				},
			}
		},
	},
	{
		// https://docs.direct.worldline-solutions.com/integration/api-developer-guide/idempotent-requests:
		// X-GCS-Idempotence-Key of up to 40 ASCII characters; every later
		// answer carries X-GCS-Idempotence-Request-Timestamp; the first
		// outcome even for another payload; 409 while in progress.
		name: "Worldline", dialect: vendors.Worldline, header: "X-GCS-Idempotence-Key",
		marked: true, honoured: true, inFlight: true, tooLong: strings.Repeat("k", 41),
		fake: func() *fake {
			stamp := func(h http.Header, first time.Time) {
				h.Set("X-GCS-Idempotence-Request-Timestamp", strconv.FormatInt(first.UnixMilli(), 10))
			}
			return &fake{
				header: "X-GCS-Idempotence-Key", valid: maxLen(40),
				decorate: func(h http.Header, _ string, first time.Time, repeat bool) {
					if repeat {
						stamp(h, first)
					}
				},
				inFlight: func(w http.ResponseWriter, first time.Time) {
					stamp(w.Header(), first)
					jsonError(w, 409, `{"errorId":"1","errors":[{"code":"1409","message":"DUPLICATE_REQUEST_IN_PROGRESS"}]}`)
				},
			}
		},
	},
	{
		// https://learn.microsoft.com/en-us/rest/api/communication/repeatable-requests
		// (OASIS Repeatable Requests 1.0): a GUID in
		// Repeatability-Request-ID, Repeatability-First-Sent in IMF-fixdate
		// within the 5 minutes tracked (else 412, rejected); accepted for a
		// new or repeated request; 400 rejected for another payload; 409
		// while the first is in progress.
		name: "Azure", dialect: vendors.Azure, header: "Repeatability-Request-ID",
		honoured: true, mismatch: true, inFlight: true, tooLong: "not-a-guid",
		fake: azureFake,
	},
	{
		// https://developers.telnyx.com/docs/development/api-fundamentals/idempotency:
		// ^[A-Za-z0-9_:-]{1,255}$; successful responses replayed; 422 for
		// another body while the record exists (its body is not
		// documented: an errors document naming the key is assumed).
		name: "Telnyx", dialect: vendors.Telnyx, header: "Idempotency-Key",
		mismatch: true, tooLong: "has.a.dot",
		fake: func() *fake {
			return &fake{
				header: "Idempotency-Key", valid: telnyxKey.MatchString,
				check: func(w http.ResponseWriter, _ *http.Request, body []byte) bool {
					if strings.Contains(string(body), "invalid") {
						jsonError(w, 422, `{"errors":[{"code":"10015","title":"Bad Request","detail":"The 'to' parameter is invalid."}]}`)
						return false
					}
					return true
				},
				mismatch: func(w http.ResponseWriter) {
					jsonError(w, 422, `{"errors":[{"code":"10015","title":"Idempotency key reused","detail":"The Idempotency-Key was already used with a different request."}]}`)
				},
			}
		},
	},
	{
		// https://resend.com/docs/dashboard/emails/idempotency-keys: up to
		// 256 characters; the first response on a retry; 409
		// invalid_idempotent_request for another payload, 409
		// concurrent_idempotent_requests while in progress.
		name: "Resend", dialect: vendors.Resend, header: "Idempotency-Key",
		mismatch: true, inFlight: true,
		fake: func() *fake {
			return &fake{
				header: "Idempotency-Key", valid: maxLen(256),
				mismatch: func(w http.ResponseWriter) {
					jsonError(w, 409, `{"statusCode":409,"name":"invalid_idempotent_request","message":"This idempotency key has already been used on a request that had a different payload."}`)
				},
				inFlight: func(w http.ResponseWriter, _ time.Time) {
					jsonError(w, 409, `{"statusCode":409,"name":"concurrent_idempotent_requests","message":"Another request with the same idempotency key is currently in progress."}`)
				},
			}
		},
	},
}

// azureFake is an Azure service that takes OASIS Repeatable Requests.
func azureFake() *fake {
	result := func(h http.Header, v string) { h.Set("Repeatability-Result", v) }
	return &fake{
		header: "Repeatability-Request-ID", valid: func(k string) bool { return uuid.Validate(k) == nil },
		check: func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
			sent, err := time.Parse(http.TimeFormat, r.Header.Get("Repeatability-First-Sent"))
			switch {
			case err != nil:
				result(w.Header(), "rejected")
				jsonError(w, 400, `{"error":{"code":"BadRequest"}}`)
				return false
			case time.Since(sent) > 5*time.Minute:
				result(w.Header(), "rejected")
				jsonError(w, 412, `{"error":{"code":"PreconditionFailed","message":"Repeatability-First-Sent header is not within 5 minutes window."}}`)
				return false
			}
			return true
		},
		decorate: func(h http.Header, _ string, _ time.Time, _ bool) { result(h, "accepted") },
		mismatch: func(w http.ResponseWriter) {
			result(w.Header(), "rejected")
			jsonError(w, 400, `{"error":{"code":"BadRequest","message":"The request does not match the earlier request with this Repeatability-Request-ID."}}`)
		},
		inFlight: func(w http.ResponseWriter, _ time.Time) {
			result(w.Header(), "accepted")
			jsonError(w, 409, `{"error":{"code":"Conflict"}}`)
		},
	}
}

// newClient returns a Client that speaks d to every server, with short
// waits, and a Transport that the test closes.
func newClient(t *testing.T, d func() idempotency.Dialect, opts ...idempotency.Option) *idempotency.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	base := []idempotency.Option{
		idempotency.WithHTTPClient(&http.Client{Transport: tr}),
		idempotency.WithBackoff(time.Millisecond, 5*time.Millisecond),
		idempotency.WithMaxRetryAfter(20 * time.Millisecond),
		idempotency.WithDialect(func(*http.Request) idempotency.Dialect { return d() }),
	}
	return clienttest.New(t, append(base, opts...)...)
}

func post(t *testing.T, c *idempotency.Client, ctx context.Context, url, body string) (*http.Response, idempotency.Outcome) {
	t.Helper()
	resp, err := c.Post(ctx, url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	resp.Body.Close()
	out, ok := idempotency.OutcomeOf(resp)
	require.True(t, ok)
	return resp, out
}

// TestVendors runs, for each API, its fake server behind the fault proxy:
// the key is sent on every attempt under the API's header and within its
// limits, the operation runs once however many responses are lost, and
// Outcome reports the API's replay, refusal and in-flight answers.
func TestVendors(t *testing.T) {
	for _, v := range vendorCases {
		t.Run(v.name, func(t *testing.T) {
			t.Run("lost responses", func(t *testing.T) {
				f := v.fake()
				// Refused before the server, then run with its response
				// lost, then answered.
				url := start(t, f, faultnet.Reset, faultnet.Drop)
				c := newClient(t, v.dialect)
				resp, out := post(t, c, t.Context(), url, `{"amount":10}`)

				assert.Equal(t, http.StatusCreated, resp.StatusCode)
				assert.Equal(t, 3, out.Attempts, "attempts")
				assert.EqualValues(t, 1, f.effects.Load(), "operations run")
				keys := f.keys(v.header)
				require.Len(t, keys, 2, "requests that reached the server")
				assert.Equal(t, out.Key, keys[0], "the key, under %s", v.header)
				assert.Equal(t, keys[0], keys[1], "the same key on every attempt")
				assert.Equal(t, v.marked, out.Replayed, "Replayed")
				assert.Equal(t, v.honoured || v.marked, out.Honoured, "Honoured")
				assert.NoError(t, out.Stopped)
			})

			// An API that documents no limit tighter than the Client's own
			// has no case here, nor one without an in-flight answer below.
			if v.tooLong != "" {
				t.Run("key outside the limits", func(t *testing.T) {
					f := v.fake()
					url := start(t, f)
					c := newClient(t, v.dialect)
					_, err := c.Post(idempotency.ContextWithKey(t.Context(), v.tooLong), url, "application/json", strings.NewReader("{}"))
					assert.ErrorIs(t, err, idempotency.ErrInvalidKey)
					assert.Empty(t, f.keys(v.header), "requests sent")
				})
			}

			t.Run("changed payload", func(t *testing.T) {
				f := v.fake()
				url := start(t, f)
				c := newClient(t, v.dialect)
				ctx := idempotency.ContextWithKey(t.Context(), uuid.NewString())
				first, _ := post(t, c, ctx, url, `{"amount":10}`)
				require.Equal(t, http.StatusCreated, first.StatusCode)
				resp, out := post(t, c, ctx, url, `{"amount":20}`)

				assert.EqualValues(t, 1, f.effects.Load(), "operations run")
				assert.Equal(t, 1, out.Attempts, "a final answer is not retried")
				if v.mismatch {
					assert.ErrorIs(t, out.Stopped, idempotency.ErrKeyMismatch)
					assert.True(t, out.Honoured, "Honoured")
				} else {
					// The API answers with the first outcome.
					assert.Equal(t, http.StatusCreated, resp.StatusCode)
					assert.NoError(t, out.Stopped)
				}
			})

			if v.inFlight {
				t.Run("in flight", func(t *testing.T) {
					f := v.fake()
					f.hold = make(chan struct{})
					url := start(t, f)
					var mu sync.Mutex
					var waits []time.Duration
					c := newClient(t, v.dialect,
						idempotency.WithAttemptTimeout(200*time.Millisecond),
						idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
							if e.Kind == idempotency.EventRetried {
								mu.Lock()
								waits = append(waits, e.Wait)
								mu.Unlock()
							}
						}))
					// The first attempt times out while the server runs it;
					// the second gets the in-flight answer; the third the
					// result.
					resp, out := post(t, c, t.Context(), url, `{"amount":10}`)

					assert.Equal(t, http.StatusCreated, resp.StatusCode)
					assert.Equal(t, 3, out.Attempts, "attempts")
					assert.EqualValues(t, 1, f.effects.Load(), "operations run")
					assert.Equal(t, v.marked, out.Replayed, "Replayed")
					assert.NoError(t, out.Stopped)
					mu.Lock()
					defer mu.Unlock()
					require.Len(t, waits, 2)
					if v.wait > 0 {
						// The API's wait, within WithMaxRetryAfter.
						assert.Equal(t, 20*time.Millisecond, waits[1], "wait after the in-flight answer")
					} else {
						assert.LessOrEqual(t, waits[1], 5*time.Millisecond, "wait after the in-flight answer: the backoff")
					}
				})
			}
		})
	}
}

// TestAzureFirstSent: Repeatability-First-Sent is fixed at the first
// attempt and sent on every retry; a key carried by ContextWithKey carries
// its first-sent time across a restart, and one older than the service
// tracks is refused as an outcome it cannot tell (412).
func TestAzureFirstSent(t *testing.T) {
	t.Run("fixed across retries", func(t *testing.T) {
		f := azureFake()
		url := start(t, f, faultnet.Drop, faultnet.Drop)
		c := newClient(t, vendors.Azure)
		before := time.Now().Truncate(time.Second)
		_, out := post(t, c, t.Context(), url, `{"to":"a@example.com"}`)
		assert.Equal(t, 3, out.Attempts)
		assert.EqualValues(t, 1, f.effects.Load())
		sent := f.keys("Repeatability-First-Sent")
		require.Len(t, sent, 3)
		assert.Equal(t, []string{sent[0], sent[0], sent[0]}, sent, "the same first-sent on every attempt")
		at, err := time.Parse(http.TimeFormat, sent[0])
		require.NoError(t, err)
		assert.False(t, at.Before(before), "first-sent %v, before the call began at %v", at, before)
	})
	t.Run("carried by ContextWithKey", func(t *testing.T) {
		f := azureFake()
		url := start(t, f, faultnet.Drop)
		key, first := uuid.NewString(), time.Now().Add(-time.Minute)
		// The process that made the key is gone; another tries again.
		c := newClient(t, vendors.Azure)
		_, out := post(t, c, idempotency.ContextWithKey(t.Context(), key, first), url, `{"to":"a@example.com"}`)
		assert.Equal(t, key, out.Key)
		want := first.UTC().Format(http.TimeFormat)
		assert.Equal(t, []string{want, want}, f.keys("Repeatability-First-Sent"))
		assert.True(t, out.Honoured)
	})
	t.Run("too old to tell", func(t *testing.T) {
		f := azureFake()
		url := start(t, f)
		c := newClient(t, vendors.Azure)
		ctx := idempotency.ContextWithKey(t.Context(), uuid.NewString(), time.Now().Add(-10*time.Minute))
		resp, out := post(t, c, ctx, url, `{"to":"a@example.com"}`)
		assert.Equal(t, http.StatusPreconditionFailed, resp.StatusCode)
		assert.ErrorIs(t, out.Stopped, idempotency.ErrOutcomeUnknown)
		assert.Equal(t, 1, out.Attempts)
		assert.Zero(t, f.effects.Load())
	})
	t.Run("the caller's first-sent wins", func(t *testing.T) {
		f := azureFake()
		url := start(t, f)
		c := newClient(t, vendors.Azure)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader("{}"))
		require.NoError(t, err)
		key, first := uuid.NewString(), time.Now().Add(-2*time.Minute).UTC().Format(http.TimeFormat)
		req.Header.Set("repeatability-request-id", key)
		req.Header["repeatability-first-sent"] = []string{first}
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, []string{first}, f.keys("Repeatability-First-Sent"))
		assert.Equal(t, []string{key}, f.keys("Repeatability-Request-ID"))
	})
}

// TestTelnyxInvalidRequest: a 422 that is not about the key is not
// reported as a key mismatch.
func TestTelnyxInvalidRequest(t *testing.T) {
	for _, v := range vendorCases {
		if v.name != "Telnyx" {
			continue
		}
		f := v.fake()
		url := start(t, f)
		c := newClient(t, v.dialect)
		resp, out := post(t, c, t.Context(), url, `{"to":"invalid"}`)
		assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
		assert.NoError(t, out.Stopped)
		assert.Equal(t, 1, out.Attempts)
	}
}

// TestThreeVendorsOneClient: one Client calls Stripe, PayPal and Azure,
// each through a lossy network, each in its own dialect, chosen by host.
func TestThreeVendorsOneClient(t *testing.T) {
	stripe, paypal, azure := vendorCases[0].fake(), vendorCases[2].fake(), azureFake()
	stripeURL := start(t, stripe, faultnet.Drop)
	paypalURL := start(t, paypal, faultnet.Drop)
	azureURL := start(t, azure, faultnet.Drop)
	host := func(u string) string { return strings.TrimPrefix(u, "http://") }
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := clienttest.New(t,
		idempotency.WithHTTPClient(&http.Client{Transport: tr}),
		idempotency.WithBackoff(time.Millisecond, 5*time.Millisecond),
		idempotency.WithDialect(func(req *http.Request) idempotency.Dialect {
			switch req.URL.Host {
			case host(stripeURL):
				return vendors.Stripe()
			case host(paypalURL):
				return vendors.PayPal()
			case host(azureURL):
				return vendors.Azure()
			}
			return idempotency.Dialect{}
		}))

	for _, tc := range []struct {
		name, url, header string
		f                 *fake
		replayed          bool
	}{
		{"Stripe", stripeURL, "Idempotency-Key", stripe, true},
		{"PayPal", paypalURL, "PayPal-Request-Id", paypal, false},
		{"Azure", azureURL, "Repeatability-Request-ID", azure, false},
	} {
		resp, out := post(t, c, t.Context(), tc.url, `{"amount":10}`)
		assert.Equal(t, http.StatusCreated, resp.StatusCode, tc.name)
		assert.Equal(t, 2, out.Attempts, tc.name)
		assert.EqualValues(t, 1, tc.f.effects.Load(), "%s: operations run", tc.name)
		assert.Equal(t, []string{out.Key, out.Key}, tc.f.keys(tc.header), "%s: the key under %s", tc.name, tc.header)
		assert.Equal(t, tc.replayed, out.Replayed, "%s: Replayed", tc.name)
		for _, other := range []string{"Idempotency-Key", "PayPal-Request-Id", "Repeatability-Request-ID", "Repeatability-First-Sent"} {
			if other == tc.header || tc.name == "Azure" && other == "Repeatability-First-Sent" {
				continue
			}
			assert.Equal(t, []string{"", ""}, tc.f.keys(other), "%s: no %s", tc.name, other)
		}
	}
}
