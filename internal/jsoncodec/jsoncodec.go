// Package jsoncodec is the engine's default codec (engine.Config.Codec):
// encoding/json, refusing strings that are not valid UTF-8, which
// encoding/json would change.
package jsoncodec

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// errInvalidUTF8 is what Codec's Marshal returns, wrapped, for a value
// holding a string that is not valid UTF-8.
var errInvalidUTF8 = errors.New("string is not valid UTF-8")

// Codec is the default engine.Codec: encoding/json. Maps are encoded with their
// keys sorted, so its encoding is deterministic.
//
// encoding/json writes U+FFFD in place of the bytes of a string that are
// not UTF-8, so that "acct-\xff" and "acct-\xfe" would be one input, and a
// result "caf\xe9" would be replayed as "caf\uFFFD". JSON refuses such a
// value instead, with an error that says where the
// string is: an input is refused before its function runs, and a result is
// recorded without its value (the function door's later calls get
// engine.ErrResultOmitted, as a step's do). Binary data is kept
// whole as a []byte (base64 in JSON); a string field, map key or element
// must hold UTF-8. A type with its own MarshalJSON encodes itself.
type Codec struct{}

// Marshal encodes v with json.Marshal, and refuses it if a string it holds
// is not valid UTF-8.
//
// The strings are checked only when the encoding holds U+FFFD, escaped or
// not: json.Marshal writes it in place of every byte that is not UTF-8 (as
// \ufffd, or as the character itself when encoding/json is built on its
// second version), so an encoding without it had none to replace. The check
// walks the value by reflection, which costs about as much as encoding it.
func (Codec) Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if bytes.Contains(b, []byte(escapedReplacement)) || bytes.Contains(b, []byte(replacement)) {
		var w walk
		if err := w.check(reflect.ValueOf(v)); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// replacement is U+FFFD in UTF-8, and escapedReplacement as encoding/json
// escapes it.
const (
	replacement        = "\uFFFD"
	escapedReplacement = `\ufffd`
)

// Unmarshal decodes data into v with json.Unmarshal.
func (Codec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// utf8Error is a string, found at path, that is not valid UTF-8.
type utf8Error struct {
	path []string // from the string out to the value, reversed
}

func (e *utf8Error) Error() string {
	var b strings.Builder
	b.WriteString("the string")
	if len(e.path) > 0 {
		b.WriteString(" at ")
		for i := len(e.path) - 1; i >= 0; i-- {
			b.WriteString(e.path[i])
		}
	}
	b.WriteString(" is not valid UTF-8: JSON would store U+FFFD in its place; " +
		"encode binary data as []byte, or set a Codec that keeps it")
	return b.String()
}

func (e *utf8Error) Unwrap() error { return errInvalidUTF8 }

// at adds step to the path of err, a *utf8Error, on the way out.
func at(err error, step string) error {
	var e *utf8Error
	if errors.As(err, &e) {
		e.path = append(e.path, step)
	}
	return err
}

// walk is one check of a value. encoding/json reports cycles, which must
// not make the check loop: as json does, it starts to remember the maps,
// slices and pointers it walks once it is deep enough into them, so that a
// value without cycles costs no memory.
type walk struct {
	depth int // of maps, slices and pointers
	seen  map[visit]bool
}

// trackAfter is the depth from which a walk remembers what it walked.
const trackAfter = 100

// visit is a map, slice or pointer walked.
type visit struct {
	ptr uintptr
	typ reflect.Type
	len int
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// check returns a *utf8Error for the first string in v that
// encoding/json would encode, and that is not valid UTF-8. It walks what
// json.Marshal encodes: exported and embedded fields (not those tagged
// "-"), map keys and values, elements, pointers and interfaces; a type that
// marshals itself is left to its method, except that the text of a
// TextMarshaler, which json writes as a string, is checked.
func (w *walk) check(v reflect.Value) error {
	if !v.IsValid() {
		return nil
	}
	t := v.Type()
	if t.Implements(jsonMarshaler) || v.CanAddr() && reflect.PointerTo(t).Implements(jsonMarshaler) {
		return nil
	}
	if t.Kind() != reflect.Pointer && v.CanAddr() && reflect.PointerTo(t).Implements(textMarshaler) {
		// json.Marshal calls a method of *T on an addressable T.
		v, t = v.Addr(), reflect.PointerTo(t)
	}
	if t.Implements(textMarshaler) && v.CanInterface() {
		if (t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface) && v.IsNil() {
			return nil
		}
		text, err := v.Interface().(encoding.TextMarshaler).MarshalText()
		if err != nil || utf8.Valid(text) {
			// An error is json.Marshal's to report.
			return nil
		}
		return &utf8Error{}
	}
	switch t.Kind() {
	case reflect.String:
		if !utf8.ValidString(v.String()) {
			return &utf8Error{}
		}
	case reflect.Interface:
		return w.check(v.Elem())
	case reflect.Pointer:
		if v.IsNil() || w.mark(v) {
			return nil
		}
		defer w.leave()
		return w.check(v.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Tag.Get("json") == "-" || !f.IsExported() && !(f.Anonymous && promoted(f.Type)) {
				continue
			}
			if err := w.check(v.Field(i)); err != nil {
				return at(err, "."+f.Name)
			}
		}
	case reflect.Map:
		if v.IsNil() || w.mark(v) {
			return nil
		}
		defer w.leave()
		// One key and one value, set to each entry in turn.
		key, val := reflect.New(t.Key()).Elem(), reflect.New(t.Elem()).Elem()
		for it := v.MapRange(); it.Next(); {
			key.SetIterKey(it)
			val.SetIterValue(it)
			if err := w.check(key); err != nil {
				return at(err, "[a key]")
			}
			if err := w.check(val); err != nil {
				return at(err, "["+mapKey(key)+"]")
			}
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && !t.Elem().Implements(jsonMarshaler) && !t.Elem().Implements(textMarshaler) {
			return nil // bytes: base64, whole
		}
		if t.Kind() == reflect.Slice {
			if v.IsNil() || w.mark(v) {
				return nil
			}
			defer w.leave()
		}
		for i := range v.Len() {
			if err := w.check(v.Index(i)); err != nil {
				return at(err, "["+strconv.Itoa(i)+"]")
			}
		}
	}
	return nil
}

// mark enters v, a pointer, map or slice, and reports whether it was
// walked already, deeper than trackAfter. Unless it reports so, leave must
// follow.
func (w *walk) mark(v reflect.Value) bool {
	if w.depth++; w.depth <= trackAfter {
		return false
	}
	k := visit{ptr: v.Pointer(), typ: v.Type()}
	if v.Kind() == reflect.Slice {
		k.len = v.Len()
	}
	if w.seen[k] {
		w.depth--
		return true
	}
	if w.seen == nil {
		w.seen = make(map[visit]bool)
	}
	w.seen[k] = true
	return false
}

// leave leaves what mark entered.
func (w *walk) leave() { w.depth-- }

// promoted reports whether an unexported field of type t is encoded by
// encoding/json: an embedded struct, or pointer to one, whose exported
// fields are promoted.
func promoted(t reflect.Type) bool {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct
}

// mapKey names a map key in an error's path.
func mapKey(k reflect.Value) string {
	if k.Kind() == reflect.String {
		return strconv.Quote(k.String())
	}
	return fmt.Sprint(k)
}
