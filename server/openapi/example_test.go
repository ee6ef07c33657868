package openapi_test

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/idemkit/idempotency/server/openapi"
)

// The problems the fragment describes, each with its status, type and code:
// an API's specification refers to the responses that group them by status
// (IdempotencyConflict for the 409s, and so on), and its clients match
// the code.
func ExampleProblems() {
	for _, p := range openapi.Problems() {
		retry := ""
		if p.Retry {
			retry = " (Retry-After)"
		}
		fmt.Printf("%d %s %s%s\n", p.Status, p.Codes[0], p.Type[strings.LastIndex(p.Type, "#")+1:], retry)
	}
	// Output:
	// 400 key_missing ErrMissingKey
	// 400 key_invalid ErrInvalidKey
	// 400 request_unidentified ErrUnidentified
	// 400 body_unreadable ErrBodyUnreadable
	// 409 in_flight ErrInFlight (Retry-After)
	// 409 outcome_unknown ErrOutcomeUnknown
	// 413 body_too_large ErrBodyTooLarge
	// 422 key_mismatch ErrKeyMismatch
	// 503 store_unavailable ErrStoreUnavailable (Retry-After)
}

// The request header, as an API's operation includes it.
func ExampleJSON() {
	var doc struct {
		Components struct {
			Parameters map[string]map[string]any `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openapi.JSON(), &doc); err != nil {
		fmt.Println(err)
		return
	}
	key := doc.Components.Parameters["IdempotencyKey"]
	fmt.Println(key["name"], "in", key["in"], "required:", key["required"])
	// Output:
	// Idempotency-Key in header required: true
}
