package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve starts the program's server on memory over loopback.
func serve(t *testing.T, minimal bool) (*httptest.Server, *router) {
	t.Helper()
	s, err := newServer(context.Background(), config{store: "memory", minimal: minimal, pool: 1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(func() {
		srv.Close()
		s.t.close()
	})
	return srv, s
}

func post(t *testing.T, url, key string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(bytes.Repeat([]byte("q"), 1024)))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

// The middleware serves the handler, replays, and the control replaces its
// store with one that holds the records asked for.
func TestMiddleware(t *testing.T) {
	srv, _ := serve(t, false)
	if code, _, body := post(t, srv.URL+"/orders", "k"); code != http.StatusCreated || !bytes.Equal(body, respBody) {
		t.Fatalf("first: %d, %d bytes; want 201 and the handler's answer", code, len(body))
	}
	if code, h, _ := post(t, srv.URL+"/orders", "k"); code != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("again: %d, replayed %q; want a replay", code, h.Get("Idempotent-Replayed"))
	}
	if code, _, body := post(t, srv.URL+"/loadbench/reset?records=3", ""); code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	if code, h, _ := post(t, srv.URL+"/orders", "k"); code != http.StatusCreated || h.Get("Idempotent-Replayed") != "" {
		t.Errorf("after a reset: %d, replayed %q; want a first execution", code, h.Get("Idempotent-Replayed"))
	}
	// A prefilled key is a completed record: another request under it is
	// refused.
	if code, _, _ := post(t, srv.URL+"/orders", "prefill-3"); code != http.StatusUnprocessableEntity {
		t.Errorf("prefill-3 with another body: %d, want 422", code)
	}
}

// The minimal statements take the path they are told to.
func TestMinimal(t *testing.T) {
	srv, _ := serve(t, true)
	kind := func(k string) {
		t.Helper()
		if code, _, body := post(t, srv.URL+"/loadbench/kind?kind="+k, ""); code != http.StatusOK {
			t.Fatalf("kind %s: %d %s", k, code, body)
		}
	}
	if code, _, body := post(t, srv.URL+"/orders", "k"); code != http.StatusCreated || !bytes.Equal(body, respBody) {
		t.Fatalf("first: %d, %d bytes; want 201 and the handler's answer", code, len(body))
	}
	if code, _, _ := post(t, srv.URL+"/orders", "k"); code != http.StatusConflict {
		t.Errorf("first again: %d, want 409 (the key has a record)", code)
	}
	kind("replay")
	if code, _, body := post(t, srv.URL+"/orders", "k"); code != http.StatusCreated || !bytes.Equal(body, respBody) {
		t.Errorf("replay: %d, %d bytes; want 201 and the stored answer", code, len(body))
	}
	if code, _, _ := post(t, srv.URL+"/orders", "other"); code != http.StatusNotFound {
		t.Errorf("replay of a key without a record: %d, want 404", code)
	}
	if code, _, _ := post(t, srv.URL+"/loadbench/kind?kind=sideways", ""); code != http.StatusInternalServerError {
		t.Errorf("an unknown kind: %d, want 500", code)
	}
}

func TestStats(t *testing.T) {
	srv, _ := serve(t, false)
	resp, err := http.Get(srv.URL + "/loadbench/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Protocol != protocol || st.Writes != 0 {
		t.Errorf("stats = %+v, %v; want protocol %d, no writes (memory)", st, err, protocol)
	}
	if resp, err := http.Get(srv.URL + "/loadbench/nothing"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown control request: %v, %v; want 404", resp, err)
	} else {
		resp.Body.Close()
	}
}
