// Package openapi describes the Idempotency-Key protocol of package server
// as an OpenAPI fragment that an API includes in its own specification: the
// request header and its syntax, the headers of the answers (the echoed key,
// the replay marker, Retry-After, Idempotent-Outcome on the "outcome
// unknown" answer, Cache-Control: no-store on every answer the middleware
// writes itself), and the problem documents that the middleware answers
// itself, each with its type and code.
//
// The fragment is written from the constants that the middleware and the
// client use (the header names, the key's syntax and length, the problem
// types and codes), so it cannot drift from them; its tests validate it with
// an OpenAPI library and check the middleware's own answers against it.
// The file idempotency.json beside this one is the fragment as JSON
// (OpenAPI 3.0.3, which tools that read 3.1 read too), kept equal to JSON()
// by a test, for an API's specification to refer to:
//
//	parameters:
//	  - $ref: 'idempotency.json#/components/parameters/IdempotencyKey'
//	responses:
//	  '409':
//	    $ref: 'idempotency.json#/components/responses/IdempotencyConflict'
//
// Its responses are named by status: IdempotencyBadRequest (400),
// IdempotencyConflict (409), IdempotencyBodyTooLarge (413),
// IdempotencyKeyMismatch (422) and IdempotencyUnavailable (503); each is one
// or more of these problems (status, code, the type's fragment after
// "https://pkg.go.dev/github.com/idemkit/idempotency/server#", and whether
// the answer carries Retry-After):
//
//	400 key_missing            ErrMissingKey
//	400 key_invalid            ErrInvalidKey (key_too_long: the same type)
//	400 request_unidentified   ErrUnidentified
//	400 body_unreadable        ErrBodyUnreadable
//	409 in_flight              ErrInFlight          Retry-After
//	409 outcome_unknown        ErrOutcomeUnknown
//	413 body_too_large         ErrBodyTooLarge
//	422 key_mismatch           ErrKeyMismatch
//	503 store_unavailable      ErrStoreUnavailable  Retry-After
package openapi

import (
	"encoding/json"
	"net/http"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/keyfield"
	"github.com/idemkit/idempotency/internal/wire"
	"github.com/idemkit/idempotency/server"
)

// version is the OpenAPI version the fragment is written in: 3.0, which
// tools that read 3.1 read too.
const version = "3.0.3"

// KeyPattern is the syntax of the Idempotency-Key header's value, as a
// regular expression that both JSON Schema (ECMA-262) and Go read: 1 to 255
// bytes of printable ASCII that neither start nor end with a space, sent
// bare or as an RFC 8941 string (between double quotes, with \" and \\
// escapes). It is what the middleware accepts.
//
// A quoted key's units are a character other than " and \, or an escape;
// the first and the last is not a space.
const KeyPattern = `^(?:[!#-~](?:[ -~]{0,253}[!-~])?|"(?:[!#-\[\]-~]|\\["\\])(?:(?:[ !#-\[\]-~]|\\["\\]){0,253}(?:[!#-\[\]-~]|\\["\\]))?")$`

// problem is one answer that the middleware writes itself: an RFC 9457
// problem document with a stable type and code.
type problem struct {
	// Name is the problem's name in the fragment's components.
	Name string
	// Status is the HTTP status it is answered with.
	Status int
	// Type is its problem type URI.
	Type string
	// Codes are the values of its code member.
	Codes []string
	// Retry says whether it carries Retry-After: the request may be
	// retried later with the same key.
	Retry bool
	// Description says when it is answered, and what a client should do.
	Description string
}

// problems returns the answers the middleware writes itself, in the order
// of their statuses.
func problems() []problem {
	return []problem{
		{"IdempotencyKeyMissing", http.StatusBadRequest, wire.ProblemBase + "ErrMissingKey", []string{wire.CodeKeyMissing}, false,
			"The request has no " + server.HeaderKey + " header, and the operation requires one. Send the request again with a key."},
		{"IdempotencyKeyInvalid", http.StatusBadRequest, wire.ProblemBase + "ErrInvalidKey", []string{wire.CodeKeyInvalid, wire.CodeKeyTooLong}, false,
			"The " + server.HeaderKey + " header is malformed: empty, longer than 255 bytes, with a character outside printable ASCII, a broken structured-field string, or sent twice. Do not retry the request as it is."},
		{"RequestUnidentified", http.StatusBadRequest, wire.ProblemBase + "ErrUnidentified", []string{wire.CodeUnidentified}, false,
			"The caller or the request could not be identified, so the key could not be looked up."},
		{"RequestBodyUnreadable", http.StatusBadRequest, wire.ProblemBase + "ErrBodyUnreadable", []string{wire.CodeBodyUnreadable}, false,
			"The request body could not be read to its end; nothing was recorded under the key, and the operation did not run."},
		{"IdempotencyInFlight", http.StatusConflict, wire.TypeInFlight, []string{wire.CodeInFlight}, true,
			"A request with the same key is still being processed. Retry with the same key after Retry-After: the retry gets the first request's answer."},
		{"IdempotencyOutcomeUnknown", http.StatusConflict, wire.TypeOutcomeUnknown, []string{wire.CodeOutcomeUnknown}, false,
			"An earlier request with this key was abandoned while it ran, and the operation allows at most one attempt: whether it took effect is unknown. This answer is final (it has no Retry-After); find out from the resource itself."},
		{"RequestBodyTooLarge", http.StatusRequestEntityTooLarge, wire.ProblemBase + "ErrBodyTooLarge", []string{wire.CodeBodyTooLarge}, false,
			"The request body is over the limit; the operation did not run."},
		{"IdempotencyKeyMismatch", http.StatusUnprocessableEntity, wire.TypeKeyMismatch, []string{wire.CodeKeyMismatch}, false,
			"The key was already used for a different request (method, path, query or body). Do not retry: a new operation needs a new key."},
		{"IdempotencyStoreUnavailable", http.StatusServiceUnavailable, wire.ProblemBase + "ErrStoreUnavailable", []string{wire.CodeStoreUnavailable}, true,
			"The record of keys could not be reached, so the request was not run. Retry with the same key after Retry-After."},
	}
}

// The names of the fragment's responses, by status: the 400, 409, 413, 422
// and 503 answers of the middleware, each one of the problems the package
// documentation lists.
const (
	responseBadRequest  = "IdempotencyBadRequest"
	responseConflict    = "IdempotencyConflict"
	responseTooLarge    = "IdempotencyBodyTooLarge"
	responseMismatch    = "IdempotencyKeyMismatch"
	responseUnavailable = "IdempotencyUnavailable"
)

// responseName names the response of each status.
func responseName(status int) string {
	switch status {
	case http.StatusBadRequest:
		return responseBadRequest
	case http.StatusConflict:
		return responseConflict
	case http.StatusRequestEntityTooLarge:
		return responseTooLarge
	case http.StatusUnprocessableEntity:
		return responseMismatch
	}
	return responseUnavailable
}

type object = map[string]any

func ref(kind, name string) object { return object{"$ref": "#/components/" + kind + "/" + name} }

// document returns the fragment as an OpenAPI document: components only,
// with no paths of its own, for an API's specification to refer to.
func document() map[string]any {
	keySchema := object{
		"type": "string", "minLength": 1, "maxLength": 2 + 2*keyfield.MaxLen, "pattern": KeyPattern,
		"example": "8e03978e-40d5-43e8-bc93-6894a57f9324",
	}
	schemas := object{
		"IdempotencyKey": keySchema,
		"Problem": object{
			"type":        "object",
			"description": "An RFC 9457 problem document.",
			"required":    []string{"type", "title", "status"},
			"properties": object{
				"type":   object{"type": "string", "format": "uri"},
				"title":  object{"type": "string"},
				"status": object{"type": "integer"},
				"detail": object{"type": "string"},
				"code":   object{"type": "string", "description": "A short machine-readable name of the problem, stable across releases."},
			},
		},
	}
	headers := object{
		"IdempotencyKey": object{
			"description": "The request's " + server.HeaderKey + ", echoed as it was sent, on every answer to a request with a valid key.",
			"schema":      ref("schemas", "IdempotencyKey"),
		},
		"IdempotentReplayed": object{
			"description": "Present on a replay: the answer is the stored answer of the first request with this key, which is not run again.",
			"schema":      object{"type": "string", "enum": []string{"true"}},
		},
		"IdempotentBodyOmitted": object{
			"description": "Present on a replay whose original body was too large to store: the request ran once, and its status and headers are replayed without the body.",
			"schema":      object{"type": "string", "enum": []string{"true"}},
		},
		"RetryAfter": object{
			"description": "Seconds to wait before retrying with the same key.",
			"schema":      object{"type": "integer", "minimum": 1},
		},
		"IdempotentOutcome": object{
			"description": "Present, as unknown, on the final 409 answer of the IdempotencyOutcomeUnknown problem, and on every replay of it: an earlier " +
				"request with this key was abandoned while it ran, and whether it took effect is unknown. It tells this answer from any other 409, " +
				"whatever its body (an API may write its refusals in a format of its own). Do not retry with this key.",
			"schema": object{"type": "string", "enum": []string{"unknown"}},
		},
		"CacheControl": object{
			"description": "no-store, on every answer that the idempotency layer writes itself: it says what the key's record holds at that moment " +
				"(in flight, unavailable, refused), and a cache that served it to a retry would hide the request's real answer.",
			"schema": object{"type": "string", "enum": []string{"no-store"}},
		},
	}
	responses := object{}
	byStatus := map[int][]problem{}
	for _, p := range problems() {
		props := object{
			"type":   object{"type": "string", "enum": []string{p.Type}},
			"status": object{"type": "integer", "enum": []int{p.Status}},
			"code":   object{"type": "string", "enum": p.Codes},
		}
		schemas[p.Name] = object{
			"description": p.Description,
			"allOf":       []any{ref("schemas", "Problem"), object{"type": "object", "properties": props}},
		}
		byStatus[p.Status] = append(byStatus[p.Status], p)
	}
	for status, ps := range byStatus {
		var one []any
		desc := ""
		retry, unknown := false, false
		for _, p := range ps {
			one = append(one, ref("schemas", p.Name))
			desc += " " + p.Description
			retry = retry || p.Retry
			unknown = unknown || p.Type == wire.TypeOutcomeUnknown
		}
		schema := one[0]
		if len(one) > 1 {
			schema = object{"oneOf": one}
		}
		// The keys are the headers' names on the wire.
		h := object{
			server.HeaderKey: ref("headers", "IdempotencyKey"),
			"Cache-Control":  ref("headers", "CacheControl"),
		}
		if retry {
			h["Retry-After"] = ref("headers", "RetryAfter")
		}
		if unknown {
			h[engine.HeaderOutcome] = ref("headers", "IdempotentOutcome")
		}
		responses[responseName(status)] = object{
			"description": http.StatusText(status) + ", answered by the idempotency layer:" + desc,
			"headers":     h,
			"content":     object{"application/problem+json": object{"schema": schema}},
		}
	}
	return object{
		"openapi": version,
		"info": object{
			"title":   "Idempotency-Key protocol",
			"version": "1",
			"description": "The " + server.HeaderKey + " request header and the answers of the idempotency layer " +
				"(github.com/idemkit/idempotency/server), for an API's specification to refer to.",
		},
		"paths": object{},
		"components": object{
			"parameters": object{
				"IdempotencyKey": object{
					"name": server.HeaderKey,
					"in":   "header",
					"description": "A key made once per operation by the client (a UUID, say) and sent on every attempt of it, so that a retry " +
						"gets the first attempt's answer instead of running again. 1 to 255 bytes of printable ASCII, sent bare or as a structured-field string. " +
						"Keys are scoped to the caller.",
					"required": true,
					"schema":   ref("schemas", "IdempotencyKey"),
				},
			},
			"headers":   headers,
			"schemas":   schemas,
			"responses": responses,
		},
	}
}

// JSON returns the fragment, an OpenAPI 3.0.3 document of components only,
// with no paths of its own, as indented JSON: the content of
// idempotency.json.
func JSON() []byte {
	b, err := json.MarshalIndent(document(), "", "  ")
	if err != nil {
		// The document holds strings, numbers, slices and maps only.
		return nil
	}
	return append(b, '\n')
}
