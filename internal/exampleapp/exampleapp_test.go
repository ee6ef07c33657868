package exampleapp_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/internal/exampleapp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAuthenticate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		apiKey  string
		status  int
		account string // what the next handler sees; "" if it does not run
	}{
		{"FirstKey", "alice-key-1", http.StatusOK, "acct_alice"},
		{"RotatedKey", "alice-key-2", http.StatusOK, "acct_alice"},
		{"OtherAccount", "bob-key", http.StatusOK, "acct_bob"},
		{"UnknownKey", "mallory-key", http.StatusUnauthorized, ""},
		{"NoKey", "", http.StatusUnauthorized, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var account string
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				account, _ = exampleapp.AccountFrom(r.Context())
			})
			r := httptest.NewRequest(http.MethodGet, "/orders/ord_1", nil)
			if tc.apiKey != "" {
				r.Header.Set("X-API-Key", tc.apiKey)
			}
			w := httptest.NewRecorder()
			exampleapp.Authenticate(exampleapp.Accounts())(next).ServeHTTP(w, r)
			assert.Equal(t, tc.status, w.Code)
			assert.Equal(t, tc.account, account, "account seen by the next handler")
			if tc.status == http.StatusUnauthorized {
				assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
				assert.JSONEq(t, `{"error":"unknown or missing X-API-Key"}`, w.Body.String())
			}
		})
	}
}

func TestScope(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	_, err := exampleapp.Scope(r)
	assert.ErrorIs(t, err, exampleapp.ErrNoAccount, "Scope() without an account")

	r = r.WithContext(exampleapp.WithAccount(r.Context(), "acct_alice"))
	scope, err := exampleapp.Scope(r)
	require.NoError(t, err)
	assert.Equal(t, "account:acct_alice", scope)
}

func TestBook(t *testing.T) {
	var b exampleapp.Book
	first := b.Add("acct_alice", "book", 1)
	assert.Equal(t, exampleapp.Order{ID: "ord_1", Account: "acct_alice", Item: "book", Quantity: 1}, first)
	assert.Equal(t, "ord_2", b.Add("acct_bob", "pen", 2).ID)
	assert.Equal(t, "ord_3", b.Add("acct_alice", "lamp", 3).ID)

	got, ok := b.Get("acct_alice", "ord_1")
	assert.True(t, ok)
	assert.Equal(t, first, got)
	_, ok = b.Get("acct_bob", "ord_1")
	assert.False(t, ok, "Get() found another account's order")
	_, ok = b.Get("acct_alice", "ord_9")
	assert.False(t, ok, "Get() found an order never added")

	assert.Equal(t, 2, b.Count("acct_alice"))
	assert.Equal(t, 1, b.Count("acct_bob"))
	assert.Equal(t, 0, b.Count("acct_carol"))
}

func TestBookConcurrentAdds(t *testing.T) {
	var b exampleapp.Book
	const n = 50
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i] = b.Add("acct_alice", "book", 1).ID })
	}
	wg.Wait()
	seen := make(map[string]bool)
	for _, id := range ids {
		assert.False(t, seen[id], "ID %s given twice", id)
		seen[id] = true
	}
	assert.Equal(t, n, b.Count("acct_alice"))
}

func TestDecodeOrder(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		want    exampleapp.OrderRequest
		invalid bool // ErrInvalidOrder rather than a decoding error
	}{
		{name: "Valid", body: `{"item":"book","quantity":2}`, want: exampleapp.OrderRequest{Item: "book", Quantity: 2}},
		{name: "UnknownFieldIgnored", body: `{"item":"book","quantity":1,"note":"x"}`, want: exampleapp.OrderRequest{Item: "book", Quantity: 1}},
		{name: "NoItem", body: `{"quantity":1}`, invalid: true},
		{name: "ZeroQuantity", body: `{"item":"book","quantity":0}`, invalid: true},
		{name: "NegativeQuantity", body: `{"item":"book","quantity":-1}`, invalid: true},
		{name: "NotJSON", body: `item=book&quantity=1`},
		{name: "Empty", body: ``},
		{name: "QuantityNotANumber", body: `{"item":"book","quantity":"1"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := exampleapp.DecodeOrder(strings.NewReader(tc.body))
			valid := tc.want != exampleapp.OrderRequest{}
			switch {
			case valid:
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
			case tc.invalid:
				assert.ErrorIs(t, err, exampleapp.ErrInvalidOrder)
			default:
				assert.Error(t, err)
				assert.False(t, errors.Is(err, exampleapp.ErrInvalidOrder), "DecodeOrder() error = %v, want a decoding error", err)
			}
		})
	}
}

func TestWriteJSON(t *testing.T) {
	w := httptest.NewRecorder()
	exampleapp.WriteJSON(w, http.StatusCreated, exampleapp.Order{ID: "ord_1", Account: "acct_alice", Item: "book", Quantity: 1})
	assert.Equal(t, http.StatusCreated, w.Code)
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	assert.JSONEq(t, `{"id":"ord_1","account":"acct_alice","item":"book","quantity":1}`, w.Body.String())
}

// Orders are numbered in the book, and each account sees only its own.
func ExampleBook() {
	var b exampleapp.Book
	for i := range 3 {
		b.Add("acct_alice", "book "+strconv.Itoa(i+1), 1)
	}
	o := b.Add("acct_bob", "pen", 2)
	_, aliceSees := b.Get("acct_alice", o.ID)
	fmt.Println(o.ID, b.Count("acct_alice"), b.Count("acct_bob"), aliceSees)
	// Output: ord_4 3 1 false
}
