package engine

// Codec encodes values for the store: the function door's inputs, for their
// fingerprint, and results, and every door's step inputs and results
// (package step). Config.Codec sets it; the default is JSON: encoding/json,
// with map keys sorted, refusing a value holding a string that is not valid
// UTF-8 (encoding/json would write U+FFFD in its place, so that "acct-\xff"
// and "acct-\xfe" would be one input and "caf\xe9" would replay as
// "caf\uFFFD"), with an error that says where the string is: an input is
// refused before its function runs, and a result is recorded without its
// value (later calls get ErrResultOmitted). Binary data is kept whole as a
// []byte (base64 in JSON); a type with its own MarshalJSON encodes itself.
//
// Marshal must be deterministic: the same input, encoded twice, must give
// the same bytes. It must also be lossless: two different inputs must give
// different bytes, or they would share a fingerprint, and a result must
// decode to what was encoded, or a replay would differ from the original.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}
