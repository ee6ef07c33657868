// Package vendors has the idempotency rules of the APIs that Go clients
// most often send payments, orders and messages to, as idempotency.Dialect
// values, each written from the API's published documentation (cited on
// each): the header of the key, the key's limits, how the API marks a
// replay, how it refuses a key reused with another payload, and how it
// answers while a request with the key is still in progress.
//
// A Client chooses one per request with idempotency.WithDialect:
//
//	client, err := idempotency.NewClient(idempotency.WithDialect(
//		func(req *http.Request) idempotency.Dialect {
//			switch req.URL.Hostname() {
//			case "api.stripe.com":
//				return vendors.Stripe()
//			case "api-m.paypal.com", "api-m.sandbox.paypal.com":
//				return vendors.PayPal()
//			}
//			return idempotency.Dialect{} // this module's own
//		}))
//
// Where an API documents no marker for something, its Dialect reports
// nothing of it: Outcome.Replayed stays false for an API that replays
// without saying so (PayPal, Checkout.com, Telnyx, Resend, Azure), and a
// refusal that the API does not tell apart from other errors is left to
// the status and the retry policy.
//
// The rules live in a package of their own so that package idempotency
// stays neutral (its zero Dialect is the protocol of its own server) and a
// change in one API's documentation changes only this package.
package vendors

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idempotency"
)

// maxLen returns a key check for APIs that take keys of up to n
// characters; the Client's own check (printable ASCII, up to 255) comes
// first.
func maxLen(api string, n int) func(string) (string, error) {
	return func(key string) (string, error) {
		if len(key) > n {
			return "", fmt.Errorf("vendors: %s takes keys of up to %d characters, not %d", api, n, len(key))
		}
		return key, nil
	}
}

// Stripe returns the rules of the Stripe API
// (https://docs.stripe.com/api/idempotent_requests): the key in
// Idempotency-Key, up to 255 characters; a replay marked
// Idempotent-Replayed: true; a key reused with other parameters refused
// with an error of type idempotency_error
// (https://stripe.dev/stripe-terminal-android/external/com.stripe.stripeterminal.external.api/-api-error-type/-i-d-e-m-p-o-t-e-n-c-y_-e-r-r-o-r/index.html),
// ErrKeyMismatch; and a key whose first request is still executing
// answered 409 with the error code idempotency_key_in_use, retried. Its
// Stripe-Should-Retry header is followed by every Client.
func Stripe() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "Idempotency-Key",
		Key:    maxLen("Stripe", 255),
		Answer: func(resp *http.Response, body []byte) (idempotency.EventKind, time.Duration, error) {
			if resp.Header.Get("Idempotent-Replayed") == "true" {
				return idempotency.EventReplayed, 0, nil
			}
			if resp.StatusCode < 400 {
				return 0, 0, nil
			}
			var doc struct {
				Error struct {
					Type string `json:"type"`
					Code string `json:"code"`
				} `json:"error"`
			}
			if json.Unmarshal(body, &doc) != nil {
				return 0, 0, nil
			}
			switch {
			case doc.Error.Code == "idempotency_key_in_use":
				return idempotency.EventRetried, 0, nil
			case doc.Error.Type == "idempotency_error":
				return 0, 0, idempotency.ErrKeyMismatch
			}
			return 0, 0, nil
		},
	}
}

// Adyen returns the rules of the Adyen API
// (https://docs.adyen.com/development-resources/api-idempotency): the key
// in Idempotency-Key, up to 64 characters. Adyen returns the response of
// the first attempt to a retry, and the key in the response's
// Idempotency-Key header to show that it processed the request
// idempotently (Outcome.Honoured); it does not say which response is a
// replay, nor document a refusal of a key reused with another payload.
func Adyen() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "Idempotency-Key",
		Key:    maxLen("Adyen", 64),
		Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
			if resp.Header.Get("Idempotency-Key") != "" {
				return idempotency.EventCompleted, 0, nil
			}
			return 0, 0, nil
		},
	}
}

// PayPal returns the rules of the PayPal REST APIs
// (https://developer.paypal.com/reference/guidelines/idempotency,
// https://developer.paypal.com/api/orders/v2/): the key in
// PayPal-Request-Id, up to 108 characters (the Orders v2 limit; other APIs
// may set their own). PayPal answers a retry with the latest status of the
// first request, without a replay marker; it refuses a key already used
// for another request with the error DUPLICATE_REQUEST_ID
// (https://developer.paypal.com/api/payment-experience/v1/errors/duplicate_request_id)
// or PAYPAL_REQUEST_ID_PREVIOUSLY_USED
// (https://developer.paypal.com/api/payment-tokens/v3/errors/paypal_request_id_previously_used),
// ErrKeyMismatch.
func PayPal() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "PayPal-Request-Id",
		Key:    maxLen("PayPal", 108),
		Answer: func(resp *http.Response, body []byte) (idempotency.EventKind, time.Duration, error) {
			if resp.StatusCode < 400 || resp.StatusCode >= 500 {
				return 0, 0, nil
			}
			var doc struct {
				Name    string `json:"name"`
				Details []struct {
					Issue string `json:"issue"`
				} `json:"details"`
			}
			if json.Unmarshal(body, &doc) != nil {
				return 0, 0, nil
			}
			names := []string{doc.Name}
			for _, d := range doc.Details {
				names = append(names, d.Issue)
			}
			for _, n := range names {
				if n == "DUPLICATE_REQUEST_ID" || n == "PAYPAL_REQUEST_ID_PREVIOUSLY_USED" {
					return 0, 0, idempotency.ErrKeyMismatch
				}
			}
			return 0, 0, nil
		},
	}
}

// checkoutInFlightWait is how long Checkout.com asks a client to wait
// before it tries again a request whose key is still being processed.
const checkoutInFlightWait = 30 * time.Second

// CheckoutCom returns the rules of the Checkout.com API
// (https://www.checkout.com/docs/payments/manage-payments/idempotency,
// https://support.checkout.com/hc/en-us/articles/24570669653010): the key
// in Cko-Idempotency-Key (a version 4 UUID, as recommended, is what the
// Client makes). Checkout.com replays a successful response without a
// marker and keeps no result for a failed one; it answers 409 to a
// request whose key is still being processed, and asks for a wait of at
// least 30 seconds before the next try: retried after 30s (or the
// Client's WithMaxRetryAfter, if shorter).
func CheckoutCom() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "Cko-Idempotency-Key",
		Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
			if resp.StatusCode == http.StatusConflict {
				return idempotency.EventRetried, checkoutInFlightWait, nil
			}
			return 0, 0, nil
		},
	}
}

// Worldline returns the rules of the Worldline APIs (Direct and Connect,
// https://docs.direct.worldline-solutions.com/integration/api-developer-guide/idempotent-requests,
// https://apireference.connect.worldline-solutions.com/s2sapi/v1/en_US/go/idempotent-requests.html):
// the key in X-GCS-Idempotence-Key, up to 40 ASCII characters. Every
// answer to a later request with the key carries
// X-GCS-Idempotence-Request-Timestamp, the time of the first: a replay,
// or, with 409, the answer that the first is still in progress, retried.
// Worldline answers a changed payload with the first outcome, so there is
// no refusal to report.
func Worldline() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "X-GCS-Idempotence-Key",
		Key:    maxLen("Worldline", 40),
		Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
			if resp.Header.Get("X-GCS-Idempotence-Request-Timestamp") == "" {
				return 0, 0, nil
			}
			if resp.StatusCode == http.StatusConflict {
				return idempotency.EventRetried, 0, nil
			}
			return idempotency.EventReplayed, 0, nil
		},
	}
}

// Azure returns the rules of OASIS Repeatable Requests Version 1.0
// (https://docs.oasis-open.org/odata/repeatable-requests/v1.0/repeatable-requests-v1.0.html),
// as Azure services that take it apply them
// (https://learn.microsoft.com/en-us/rest/api/communication/repeatable-requests):
// the key in Repeatability-Request-ID, a GUID, with
// Repeatability-First-Sent, the time of the first attempt, the same on
// every retry (see idempotency.ContextWithKey to keep it across restarts).
// The response says Repeatability-Result: accepted for a request taken as
// repeatable, new or repeated alike (Outcome.Honoured; the API does not
// tell a replay apart), and rejected for one refused: with 400, a key
// reused with another request (ErrKeyMismatch); with 412, a first-sent
// time older than the service tracks (5 minutes for Azure Communication
// Services), so the service will not run the request and cannot say
// whether it ran (ErrOutcomeUnknown). A 409 says that the first request
// is still in progress: retried.
func Azure() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "Repeatability-Request-ID",
		Key: func(key string) (string, error) {
			if len(key) != 36 || uuid.Validate(key) != nil {
				return "", errors.New("vendors: Azure takes a GUID as Repeatability-Request-ID")
			}
			return key, nil
		},
		Answer: func(resp *http.Response, _ []byte) (idempotency.EventKind, time.Duration, error) {
			switch strings.ToLower(strings.TrimSpace(resp.Header.Get("Repeatability-Result"))) {
			case "rejected":
				switch resp.StatusCode {
				case http.StatusPreconditionFailed:
					return 0, 0, idempotency.ErrOutcomeUnknown
				case http.StatusBadRequest:
					return 0, 0, idempotency.ErrKeyMismatch
				}
				return idempotency.EventCompleted, 0, nil
			case "accepted":
				if resp.StatusCode == http.StatusConflict {
					return idempotency.EventRetried, 0, nil
				}
				return idempotency.EventCompleted, 0, nil
			}
			return 0, 0, nil
		},
	}
}

// Telnyx returns the rules of the Telnyx API
// (https://developers.telnyx.com/docs/development/api-fundamentals/idempotency):
// the key in Idempotency-Key, unquoted, of 1 to 255 letters, digits,
// hyphens, underscores or colons. Telnyx replays only successful responses,
// without a marker, and answers 422 to a key reused with another body or
// query while the first record exists: a 422 whose errors speak of the
// idempotency key is ErrKeyMismatch (a 422 is also Telnyx's answer to an
// invalid request, which is not).
func Telnyx() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "Idempotency-Key",
		Key: func(key string) (string, error) {
			for i := 0; i < len(key); i++ {
				switch c := key[i]; {
				case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == ':', c == '-':
				default:
					return "", fmt.Errorf("vendors: Telnyx takes keys of letters, digits, '_', ':' and '-', not %q", c)
				}
			}
			return key, nil
		},
		Answer: func(resp *http.Response, body []byte) (idempotency.EventKind, time.Duration, error) {
			if resp.StatusCode != http.StatusUnprocessableEntity {
				return 0, 0, nil
			}
			var doc struct {
				Errors []struct {
					Title  string `json:"title"`
					Detail string `json:"detail"`
				} `json:"errors"`
			}
			if json.Unmarshal(body, &doc) != nil {
				return 0, 0, nil
			}
			for _, e := range doc.Errors {
				if strings.Contains(strings.ToLower(e.Title+" "+e.Detail), "idempotency") {
					return 0, 0, idempotency.ErrKeyMismatch
				}
			}
			return 0, 0, nil
		},
	}
}

// Resend returns the rules of the Resend email API
// (https://resend.com/docs/dashboard/emails/idempotency-keys): the key in
// Idempotency-Key, of up to 256 characters (the Client's own limit, 255,
// is the tighter one). Resend answers a retry with the first response,
// without a marker; 409 invalid_idempotent_request to a key used with
// another payload (ErrKeyMismatch); and 409
// concurrent_idempotent_requests while the first request is in progress,
// retried.
func Resend() idempotency.Dialect {
	return idempotency.Dialect{
		Header: "Idempotency-Key",
		Key:    maxLen("Resend", 256),
		Answer: func(resp *http.Response, body []byte) (idempotency.EventKind, time.Duration, error) {
			if resp.StatusCode != http.StatusConflict {
				return 0, 0, nil
			}
			var doc struct {
				Name string `json:"name"`
			}
			if json.Unmarshal(body, &doc) != nil {
				return 0, 0, nil
			}
			switch doc.Name {
			case "invalid_idempotent_request":
				return 0, 0, idempotency.ErrKeyMismatch
			case "concurrent_idempotent_requests":
				return idempotency.EventRetried, 0, nil
			}
			return 0, 0, nil
		},
	}
}
