package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
	"github.com/idemkit/idempotency/webhook"
)

// signStandard signs body for id at the timestamp ts, as written, with
// standardSecret: "v1,<base64>" over "{id}.{ts}.{body}".
func signStandard(t *testing.T, id, ts string, body []byte) string {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(standardSecret, "whsec_"))
	require.NoError(t, err)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// standardRequest is a delivery of body for id, signed now, to target.
func standardRequest(t *testing.T, target, id string, body []byte) *http.Request {
	t.Helper()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req, err := http.NewRequest(http.MethodPost, target, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Webhook-Id", id)
	req.Header.Set("Webhook-Timestamp", ts)
	req.Header.Set("Webhook-Signature", signStandard(t, id, ts, body))
	return req
}

// serveDirect runs h on req in this goroutine and returns its answer.
func serveDirect(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestMaxBodyAtItsMaximum: a Sender whose MaxBody is the largest
// int64 reads the whole body, and a genuine delivery is accepted.
func TestMaxBodyAtItsMaximum(t *testing.T) {
	sender := webhook.StandardWebhooks(standardSecret)
	sender.MaxBody = math.MaxInt64
	rc, err := webhook.New(teststores.Memory(t), sender)
	require.NoError(t, err)
	var e effects
	h := rc.Handler(counting(&e))
	w := serveDirect(h, standardRequest(t, "http://hooks.test/", "msg_max", payload))
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, 1, e.of("msg_max"))

	req := standardRequest(t, "http://hooks.test/", "msg_max_chunked", payload)
	req.ContentLength = -1
	w = serveDirect(h, req)
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, 1, e.of("msg_max_chunked"))
}

// TestRetryAfterAtItsMaximum: the longest RetryAfter is answered as
// the seconds it is, not wrapped around to 1.
func TestRetryAfterAtItsMaximum(t *testing.T) {
	store := faultstore.New(teststores.Memory(t))
	store.Set(faultstore.Claim, faultstore.Fault{Err: errors.New("connection refused")})
	rc := newReceiver(t, store, webhook.WithConfig(engine.Config{RetryAfter: math.MaxInt64}))
	var e effects
	w := serveDirect(rc.Handler(counting(&e)), standardRequest(t, "http://hooks.test/", "msg_ra", payload))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "9223372037", w.Header().Get("Retry-After"))
	assert.Equal(t, 0, e.of("msg_ra"))
}
