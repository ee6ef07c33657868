package openapi_test

import (
	"encoding/json"
	"fmt"

	"github.com/idemkit/idempotency/server/openapi"
)

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
