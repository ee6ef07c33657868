package once

// What the tests reach of the package's own.
var (
	// JSON is the default Codec.
	JSON Codec = jsonCodec{}
	// ErrInvalidUTF8 is wrapped by JSON's refusal of a string that is not
	// UTF-8.
	ErrInvalidUTF8 = errInvalidUTF8
)

// MaxKeyLen is the longest key accepted.
const MaxKeyLen = maxKeyLen

// StatusInvalid is the status of a call refused before any claim.
const StatusInvalid = statusInvalid
