package openapi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/keyfield"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
	"github.com/idemkit/idempotency/server"
	"github.com/idemkit/idempotency/server/openapi"
	"github.com/idemkit/idempotency/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var update = flag.Bool("update", false, "rewrite idempotency.json from openapi.JSON")

// TestFileIsCurrent: idempotency.json is what JSON returns; go test
// -update rewrites it.
func TestFileIsCurrent(t *testing.T) {
	if *update {
		require.NoError(t, os.WriteFile("idempotency.json", openapi.JSON(), 0o644))
	}
	b, err := os.ReadFile("idempotency.json")
	require.NoError(t, err)
	assert.Equal(t, string(openapi.JSON()), string(b), "run go test ./server/openapi -update")
}

func load(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openapi.JSON())
	require.NoError(t, err)
	return doc
}

// TestValid: an OpenAPI library reads the fragment and finds it valid, with
// every component an API refers to.
func TestValid(t *testing.T) {
	doc := load(t)
	require.NoError(t, doc.Validate(t.Context()))
	assert.Equal(t, "3.0.3", doc.OpenAPI)

	p := doc.Components.Parameters["IdempotencyKey"]
	require.NotNil(t, p)
	assert.Equal(t, server.HeaderKey, p.Value.Name)
	assert.Equal(t, "header", p.Value.In)
	assert.True(t, p.Value.Required)
	assert.Equal(t, openapi.KeyPattern, p.Value.Schema.Value.Pattern)
	for _, name := range []string{"IdempotencyKey", "IdempotentReplayed", "IdempotentBodyOmitted", "RetryAfter", "IdempotentOutcome", "CacheControl"} {
		assert.Contains(t, doc.Components.Headers, name)
	}
	for _, name := range []string{"IdempotencyBadRequest", "IdempotencyConflict", "IdempotencyBodyTooLarge", "IdempotencyKeyMismatch", "IdempotencyUnavailable"} {
		r := doc.Components.Responses[name]
		if assert.NotNil(t, r, name) {
			assert.NotNil(t, r.Value.Content.Get("application/problem+json"), name)
		}
	}
}

// TestKeyPatternIsTheParser: the fragment's syntax of a key accepts what the
// middleware's parser accepts, and nothing else.
func TestKeyPatternIsTheParser(t *testing.T) {
	re := regexp.MustCompile(openapi.KeyPattern)
	long := strings.Repeat("k", keyfield.MaxLen)
	values := []string{
		"a", "8e03978e-40d5-43e8-bc93-6894a57f9324", "a b", `a"b`, `a\b`, "~!", long, long + "k",
		"", " a", "a ", " ", "a\tb", "é", "a\x7f",
		`"a"`, `"a b"`, `"a\"b"`, `"a\\b"`, `""`, `" a"`, `"a "`, `"a`, `"a"b`, `"a\b"`, `"a"""`, `"` + long + `"`, `"` + long + `k"`,
		`"` + strings.Repeat(`\"`, keyfield.MaxLen) + `"`, `"` + strings.Repeat(`\"`, keyfield.MaxLen+1) + `"`,
	}
	for c := 0; c < 128; c++ {
		values = append(values, "k"+string(rune(c))+"k", `"k`+string(rune(c))+`k"`)
	}
	for _, v := range values {
		_, err := keyfield.Parse(v)
		assert.Equal(t, err == nil, re.MatchString(v), "%q: parser error %v", v, err)
	}
}

// answer is what the middleware answered a request.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, srv *httptest.Server, key []string, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
	require.NoError(t, err)
	if key != nil {
		req.Header[server.HeaderKey] = key
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, resp.Header, b}
}

// TestMiddlewareAnswersMatch provokes each answer the middleware writes
// itself and checks it against the fragment: its status has a response
// there, its body validates against that response's schema, its type is
// the one the fragment gives the problem, and its Retry-After is there
// when the fragment says so.
func TestMiddlewareAnswersMatch(t *testing.T) {
	doc := load(t)
	mem, err := memstore.New()
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	faulty := faultstore.New(mem)
	mw, err := server.New(faulty, server.WithMaxBody(64))
	require.NoError(t, err)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(server.HeaderKey) == "slow" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)

	problems := map[string]openapi.Problem{}
	for _, p := range openapi.Problems() {
		problems[p.Name] = p
	}
	got := map[string]answer{
		"IdempotencyKeyMissing": do(t, srv, nil, "{}"),
		"IdempotencyKeyInvalid": do(t, srv, []string{"a\tb"}, "{}"),
		"RequestBodyTooLarge":   do(t, srv, []string{"big"}, strings.Repeat("x", 65)),
	}
	require.Equal(t, http.StatusCreated, do(t, srv, []string{"used"}, "{}").status)
	got["IdempotencyKeyMismatch"] = do(t, srv, []string{"used"}, `{"other":1}`)

	first := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(server.HeaderKey, "slow")
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		first <- answer{}
	}()
	<-entered
	got["IdempotencyInFlight"] = do(t, srv, []string{"slow"}, "{}")
	close(release)
	<-first

	faulty.Set(faultstore.Claim, faultstore.Fault{Err: errors.New("down")})
	got["IdempotencyStoreUnavailable"] = do(t, srv, []string{"any"}, "{}")
	faulty.Clear(faultstore.Claim)

	got["IdempotencyOutcomeUnknown"] = outcomeUnknown(t, mem)

	for name, a := range got {
		t.Run(name, func(t *testing.T) {
			p := problems[name]
			require.Equal(t, p.Status, a.status, "%s", a.body)
			var resp *openapi3.ResponseRef
			for _, r := range doc.Components.Responses {
				if r.Value.Description != nil && strings.HasPrefix(*r.Value.Description, http.StatusText(a.status)+",") {
					resp = r
				}
			}
			require.NotNil(t, resp, "a response for %d", a.status)
			media := resp.Value.Content.Get("application/problem+json")
			require.NotNil(t, media)
			assert.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
			var v any
			require.NoError(t, json.Unmarshal(a.body, &v))
			assert.NoError(t, media.Schema.Value.VisitJSON(v), "%s", a.body)
			var doc struct {
				Type string `json:"type"`
				Code string `json:"code"`
			}
			require.NoError(t, json.Unmarshal(a.body, &doc))
			assert.Equal(t, p.Type, doc.Type)
			if doc.Code != "" { // the code member, where the middleware writes it
				assert.Contains(t, p.Codes, doc.Code)
			}
			assert.Equal(t, p.Retry, a.header.Get("Retry-After") != "", "Retry-After")
			// Every header of the protocol that the answer carries is
			// declared, under its name, and its value is valid.
			for _, name := range protocolHeaders {
				v := a.header.Get(name)
				if v == "" {
					continue
				}
				h := resp.Value.Headers[name]
				if !assert.NotNil(t, h, "%s: %s is not declared", name, v) {
					continue
				}
				assert.NoError(t, h.Value.Schema.Value.VisitJSON(headerValue(h.Value.Schema.Value, v)), "%s: %s", name, v)
			}
		})
	}
}

// protocolHeaders are the response headers that the middleware sets on the
// answers it writes itself.
var protocolHeaders = []string{server.HeaderKey, "Retry-After", engine.HeaderOutcome, "Cache-Control", server.HeaderReplayed}

// headerValue is v as its schema types it.
func headerValue(schema *openapi3.Schema, v string) any {
	if schema.Type.Is("integer") {
		if n, err := strconv.Atoi(v); err == nil {
			return float64(n)
		}
	}
	return v
}

// outcomeUnknown provokes the "outcome unknown" answer: a retry, under
// RefuseAbandoned, of a request whose holder was lost.
func outcomeUnknown(t *testing.T, store engine.Store) answer {
	t.Helper()
	mw, err := server.New(store,
		server.WithConfig(engine.Config{Abandoned: engine.RefuseAbandoned}),
		server.WithScope(func(*http.Request) (string, error) { return "tenant", nil }),
		server.WithFingerprint(func(*http.Request, []byte) (string, error) { return "fingerprint", nil }))
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	id := engine.ID{Scope: "tenant", Key: "lost"}
	c, err := store.Claim(t.Context(), id, "fingerprint", time.Millisecond, time.Hour)
	require.NoError(t, err)
	require.Equal(t, engine.Acquired, c.Status)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := do(t, srv, []string{"lost"}, "{}")
		if a.header.Get(engine.HeaderOutcome) != "" {
			return a
		}
		require.Equal(t, http.StatusConflict, a.status, "%s", a.body)
		require.False(t, time.Now().After(deadline), "the lost holder's 1ms lease was not taken over in 10s")
	}
}

// TestSchemasTellProblemsApart: a problem document validates against its
// own schema and not against another problem's of the same status.
func TestSchemasTellProblemsApart(t *testing.T) {
	doc := load(t)
	for _, p := range openapi.Problems() {
		body, err := json.Marshal(map[string]any{"type": p.Type, "title": "t", "status": p.Status, "code": p.Codes[0]})
		require.NoError(t, err)
		var v any
		require.NoError(t, json.NewDecoder(bytes.NewReader(body)).Decode(&v))
		for _, other := range openapi.Problems() {
			err := doc.Components.Schemas[other.Name].Value.VisitJSON(v)
			if other.Name == p.Name {
				assert.NoError(t, err, p.Name)
			} else {
				assert.Error(t, err, "%s validates as %s", p.Name, other.Name)
			}
		}
	}
}
