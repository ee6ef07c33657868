package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/idemkit/idempotency/step"
	"github.com/idemkit/idempotency/store/memstore"
	"github.com/idemkit/idempotency/webhook"
)

// post sends body to url with the Standard Webhooks headers of a delivery
// of id, signed with secret as the sender signs it, and prints the answer.
func post(url, secret, id, body string) {
	wh, _ := standardwebhooks.NewWebhook(secret)
	now := time.Now()
	sig, _ := wh.Sign(id, now, []byte(body))
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
}

// postStripe sends body to url as Stripe delivers an event: signed with
// secret in Stripe-Signature, over the timestamp and the body. It prints
// the answer.
func postStripe(url, secret, body string) {
	t := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(t + "." + body))
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", "t="+t+",v1="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
}

// A receiver of Stripe's events on a mux: Stripe delivers an event again
// when its first answer was lost, and the handler runs once. The records
// are in memory here; a service with several instances shares them in
// pgstore or redisstore.
func ExampleStripe() {
	secret := "whsec_4eC39HqLyjWDarjtT1zdp7dc" // os.Getenv("STRIPE_WEBHOOK_SECRET")
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	rc, err := webhook.New(store, webhook.Stripe(secret),
		webhook.WithEndpoint("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer rc.Shutdown(context.Background())

	var paid atomic.Int32
	onEvent := func(w http.ResponseWriter, r *http.Request) {
		paid.Add(1) // mark the invoice paid; a 2xx is kept, an error released
	}
	mux := http.NewServeMux()
	mux.Handle("POST /hooks/stripe", rc.Handler(http.HandlerFunc(onEvent)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	event := `{"id":"evt_1PqRsT","type":"invoice.paid"}`
	postStripe(srv.URL+"/hooks/stripe", secret, event)
	postStripe(srv.URL+"/hooks/stripe", secret, event) // Stripe's retry
	postStripe(srv.URL+"/hooks/stripe", "whsec_forged", event)
	fmt.Println("invoices paid:", paid.Load())
	// Output:
	// 200 replayed: false
	// 200 replayed: true
	// 401 replayed: false
	// invoices paid: 1
}

// A receiver of Standard Webhooks deliveries: the sender delivers the same
// event twice (its first answer was lost), and the handler runs once; a
// forged delivery is refused before the store.
func Example() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	store, _ := memstore.New()
	defer store.Close()
	rc, err := webhook.New(store, webhook.StandardWebhooks(secret), webhook.WithEndpoint("billing"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rc.Shutdown(context.Background())

	var paid atomic.Int32
	srv := httptest.NewServer(rc.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paid.Add(1) // mark the invoice paid
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()

	post(srv.URL, secret, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", `{"type":"invoice.paid"}`)
	post(srv.URL, secret, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", `{"type":"invoice.paid"}`)
	post(srv.URL, "whsec_dGhpcyBpcyBhbm90aGVyIHNlY3JldCBrZXk=", "msg_forged", `{"type":"invoice.paid"}`)
	fmt.Println("invoices paid:", paid.Load(), "records:", store.Len())
	// Output:
	// 204 replayed: false
	// 204 replayed: true
	// 401 replayed: false
	// invoices paid: 1 records: 1
}

// A sender without a preset: it signs the body with a hex HMAC-SHA256 in
// X-Signature and names the event in X-Event-Id. Verify compares in
// constant time; ID says where the id is.
func Example_sender() {
	secret := []byte("s3cret")
	sender := webhook.Sender{
		Name: "acme",
		Verify: func(r *http.Request, body []byte, _ time.Time) error {
			sig, err := hex.DecodeString(r.Header.Get("X-Signature"))
			if err != nil || len(sig) == 0 {
				return fmt.Errorf("%w: X-Signature missing", webhook.ErrMalformed)
			}
			mac := hmac.New(sha256.New, secret)
			mac.Write(body)
			if !hmac.Equal(mac.Sum(nil), sig) {
				return webhook.ErrUnverified
			}
			return nil
		},
		ID: func(r *http.Request, _ []byte) (string, error) {
			return r.Header.Get("X-Event-Id"), nil
		},
		TTL:  72 * time.Hour,  // acme retries for two days
		Wait: 8 * time.Second, // and waits 10 s for an answer
	}
	store, _ := memstore.New()
	defer store.Close()
	rc, err := webhook.New(store, sender)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rc.Shutdown(context.Background())
	h := rc.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	body := `{"order":42}`
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(body))
	for _, sig := range []string{hex.EncodeToString(mac.Sum(nil)), hex.EncodeToString(mac.Sum(nil)), "00ff"} {
		req := httptest.NewRequest(http.MethodPost, "/hooks/acme", strings.NewReader(body))
		req.Header.Set("X-Signature", sig)
		req.Header.Set("X-Event-Id", "ev_1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		fmt.Println(w.Code, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 200 replayed: false
	// 200 replayed: true
	// 401 replayed: false
}

// A handler with two effects runs the first as a step (package step):
// when the handler fails after it and the sender retries, the retry runs
// the handler again but does not send the email twice.
func Example_steps() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	store, _ := memstore.New()
	defer store.Close()
	rc, _ := webhook.New(store, webhook.StandardWebhooks(secret))
	defer rc.Shutdown(context.Background())

	var emails, ledgerDown atomic.Int32
	ledgerDown.Store(1)
	srv := httptest.NewServer(rc.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := step.Run(r.Context(), "receipt-email", nil,
			func(ctx context.Context) (bool, error) { emails.Add(1); return true, nil })
		if err != nil || ledgerDown.Add(-1) >= 0 {
			// The ledger is down: the key is released, and the sender
			// retries.
			http.Error(w, "ledger unavailable", http.StatusServiceUnavailable)
			return
		}
	})))
	defer srv.Close()

	post(srv.URL, secret, "msg_1", `{"type":"invoice.paid"}`)
	post(srv.URL, secret, "msg_1", `{"type":"invoice.paid"}`)
	post(srv.URL, secret, "msg_1", `{"type":"invoice.paid"}`)
	fmt.Println("emails sent:", emails.Load())
	// Output:
	// 503 replayed: false
	// 200 replayed: false
	// 200 replayed: true
	// emails sent: 1
}
