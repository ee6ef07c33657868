package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
)

// replayMode says where the bodies of retries come from.
type replayMode uint8

const (
	replayNone    replayMode = iota // no body: nothing to replay
	replayBuffer                    // the body was read into memory
	replayGetBody                   // the request's GetBody
	replayStream                    // too large to buffer, no GetBody: no retries
)

// replay gives each attempt of a request its own copy of the body. Each
// attempt gets a distinct reader, so that a Transport still writing an
// abandoned attempt's body (net/http may, after RoundTrip returns) can never
// read from the next attempt's.
type replay struct {
	mode    replayMode
	buf     []byte
	getBody func() (io.ReadCloser, error)
}

// prepare sets the body of clone, the request of the first attempt, from
// req's, and records how to replay it. It closes req.Body when it has read
// it all; otherwise the Transport closes it, as net/http does. On error the
// body is closed too, and so it is when req's context ends while the body
// is read.
func (r *replay) prepare(req, clone *http.Request, limit int64) error {
	body := req.Body
	switch {
	case body == nil || body == http.NoBody:
		r.mode = replayNone
		return nil
	case req.GetBody != nil:
		r.mode = replayGetBody
		r.getBody = req.GetBody
		return nil
	}

	ctx := req.Context()
	var stop func() bool
	if ctx.Done() != nil {
		// A Read that blocks must not outlive the caller's context: closing
		// the body ends it, as net/http closes the body of a request that
		// is canceled.
		stop = context.AfterFunc(ctx, func() { body.Close() })
	}
	buf, complete, err := readUpTo(body, limit, req.ContentLength)
	if stop != nil && !stop() {
		body.Close()
		return fmt.Errorf("reading request body: %w", ctx.Err())
	}
	if !complete || err != nil {
		if err != nil {
			body.Close()
			return fmt.Errorf("reading request body: %w", err)
		}
		// Send what was read, then the rest, once.
		r.mode = replayStream
		clone.Body = &streamBody{Reader: io.MultiReader(bytes.NewReader(buf), body), c: body}
		clone.GetBody = nil
		return nil
	}
	body.Close()
	if req.ContentLength > 0 && int64(len(buf)) != req.ContentLength {
		return fmt.Errorf("request body has %d bytes, ContentLength says %d", len(buf), req.ContentLength)
	}
	if len(buf) == 0 {
		r.mode = replayNone
		clone.Body = http.NoBody
		clone.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
		clone.ContentLength = 0
		return nil
	}
	r.mode = replayBuffer
	r.buf = buf
	clone.Body = newBytesBody(buf)
	// Also lets net/http follow a 307 or 308 redirect, and resend on a
	// keep-alive connection that the server had closed.
	clone.GetBody = r.next
	// Known now, so the body is not sent chunked.
	clone.ContentLength = int64(len(buf))
	return nil
}

// replayable reports whether a retry can have a body.
func (r *replay) replayable() bool {
	return r.mode != replayStream
}

// next returns the body for another attempt, nil if the request has none.
func (r *replay) next() (io.ReadCloser, error) {
	switch r.mode {
	case replayBuffer:
		return newBytesBody(r.buf), nil
	case replayGetBody:
		body, err := r.getBody()
		if err != nil {
			return nil, fmt.Errorf("%w: GetBody: %w", ErrBodyNotReplayable, err)
		}
		if body == nil {
			body = http.NoBody
		}
		return body, nil
	case replayStream:
		return nil, ErrBodyNotReplayable
	}
	return nil, nil
}

// maxPrealloc is the most that readUpTo allocates ahead of the bytes it
// has read, on the word of a size hint: a ContentLength can lie.
const maxPrealloc = 32 << 10

// readUpTo reads r to its end if that takes at most limit bytes, and
// reports whether it did. Otherwise it stops after limit+1 bytes and returns
// those. sizeHint is the expected size, if positive. The buffer grows with
// the bytes that arrive, whatever limit and sizeHint say.
func readUpTo(r io.Reader, limit, sizeHint int64) (buf []byte, complete bool, err error) {
	// The most bytes to read, limit+1, without overflow, and addressable.
	most := min(max(limit, 0), int64(math.MaxInt)-1) + 1
	size := int64(512)
	if sizeHint > 0 {
		size = min(sizeHint, maxPrealloc) + 1 // room to see EOF without growing
	}
	buf = make([]byte, 0, min(size, most))
	for {
		if len(buf) == cap(buf) {
			// Doubles, up to most.
			buf = slices.Grow(buf, int(min(int64(cap(buf)), most-int64(len(buf)))))
		}
		n, err := r.Read(buf[len(buf):int(min(int64(cap(buf)), most))])
		buf = buf[:len(buf)+n]
		switch {
		case int64(len(buf)) == most:
			// Over the limit, or more than a slice can hold.
			return buf, false, nil
		case err == io.EOF:
			return buf, true, nil
		case err != nil:
			return nil, false, err
		}
	}
}

// bytesBody is an attempt's copy of a buffered body.
type bytesBody struct {
	bytes.Reader
}

func newBytesBody(buf []byte) *bytesBody {
	b := new(bytesBody)
	b.Reset(buf)
	return b
}

func (*bytesBody) Close() error { return nil }

// streamBody is the body of the only attempt of a request whose body is too
// large to buffer: the part read while trying to buffer it, then the rest.
type streamBody struct {
	io.Reader
	c io.Closer
}

func (b *streamBody) Close() error { return b.c.Close() }
