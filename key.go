package idempotency

import (
	"context"
	"crypto/rand"
	"sync"
	"time"

	"github.com/google/uuid"
)

// NewKey returns a new idempotency key: a random (version 4) UUID in its
// 36-character text form, such as "f47ac10b-58cc-4372-a567-0e02b2c3d479".
// Its 122 random bits come from crypto/rand.
//
// Do makes a key like it for every keyed request that has no key yet, so
// most callers never need it; use it to make a key that must outlive the
// process, store it with the operation, and pass it to every try of that
// operation with ContextWithKey.
func NewKey() string {
	return uuid.NewString()
}

// keySource makes a Client's keys. Every read of crypto/rand has a fixed
// cost, a system call on most systems (and still about 100 ns where Linux
// provides getrandom in the vDSO), which a key of 16 bytes would pay in
// full; the source reads 4 KiB at a time and hands the bytes out, so that a
// key pays little more than its share of the generation. The bytes are
// crypto/rand's and each is handed out once, so keys stay unpredictable
// and distinct. Each Client has its own source: nothing is shared between
// Clients, and package uuid's global random pool (uuid.EnableRandPool) is
// left alone.
//
// A keySource is safe for concurrent use. The zero value is ready to use.
type keySource struct {
	mu   sync.Mutex
	left int // buf[len(buf)-left:] holds the bytes not yet handed out
	buf  [4096]byte
}

// Read fills p with random bytes. It never fails, as crypto/rand.Read never
// does. The bytes it hands out are cleared from the buffer, so that the
// buffer never holds a key that was already made.
func (s *keySource) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := 0; n < len(p); {
		if s.left == 0 {
			rand.Read(s.buf[:])
			s.left = len(s.buf)
		}
		b := s.buf[len(s.buf)-s.left:]
		m := copy(p[n:], b)
		clear(b[:m])
		s.left -= m
		n += m
	}
	return len(p), nil
}

// newKey makes a version 4 key.
func (s *keySource) newKey() string {
	// What uuid.NewRandomFromReader does, without its allocation: through
	// an io.Reader, the UUID would escape to the heap.
	var u uuid.UUID
	s.Read(u[:])
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // variant 10, RFC 9562's
	return u.String()
}

type contextKey struct{}

// contextKeyValue is what ContextWithKey puts in a context.
type contextKeyValue struct {
	key       string
	firstSent time.Time
}

// ContextWithKey returns a copy of ctx that carries key as the idempotency key for
// a request made with it. Use it when one logical operation spans several
// calls to Do, possibly in several processes: make the key once (NewKey),
// store it with the operation, and send it on every try, so that the server
// runs the operation at most once.
//
// firstSent, if given, is when the operation was first sent, for an API
// that speaks OASIS Repeatable Requests (see Dialect.Header), which must
// get the same Repeatability-First-Sent on every try: store time.Now()
// with the key, before the first try, and give both to every try. Without
// it, the Client takes the start of each call to Do. Only the first
// firstSent is used; a Repeatability-First-Sent in the request's header
// wins over it.
//
// A key in the request header takes precedence over the context's key. The
// context's key is used only for methods that get keys (POST and PATCH by
// default; see [WithMethods]). Do checks the key and returns an error
// wrapping ErrInvalidKey if it is not valid.
func ContextWithKey(ctx context.Context, key string, firstSent ...time.Time) context.Context {
	v := contextKeyValue{key: key}
	if len(firstSent) > 0 {
		v.firstSent = firstSent[0]
	}
	return context.WithValue(ctx, contextKey{}, v)
}

// KeyFromContext returns the key stored in ctx by ContextWithKey, if any.
func KeyFromContext(ctx context.Context) (string, bool) {
	v, ok := ctx.Value(contextKey{}).(contextKeyValue)
	return v.key, ok
}

// keyFromContext returns what ContextWithKey stored in ctx, if anything.
func keyFromContext(ctx context.Context) (contextKeyValue, bool) {
	v, ok := ctx.Value(contextKey{}).(contextKeyValue)
	return v, ok
}
