package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idempotency/engine"
)

// The record layout. A record is one Redis string: a fixed header (42 bytes
// in version 3, 30 before), the fingerprint, and, once completed, the
// response. Integers are big-endian. The functions (functions.go) read the
// header with string.byte, string.sub and struct.unpack, and compare its
// first ten bytes (version, state, token) with bytes built here; they never
// look inside the response, which is decoded here.
//
//	offset  size  versions 3 and 2               version 1 (read only)
//	0       1     version                        version
//	1       1     state: 1 in flight, 2 completed, 3 released,
//	              4 (version 3) in flight with steps
//	2       8     fencing token
//	10      8     nonce of the call that last    end of the lease, µs since
//	              changed the state              the epoch, server's clock
//	18      8     slack: ms that the record      nonce
//	              outlives its lease (in flight)
//	26      4     fingerprint length n
//	30      4     version 3: abandoned holders before this one;
//	              in state 4, 2^32-1 is -1 (see Store.Release)
//	34      8     version 3: when the record was first claimed, ms since
//	              the epoch, by the claiming machine's clock
//	h       n     fingerprint, h the header's size (42, or 30 before 3)
//	h+n           response (completed only, every version):
//	              2 status, 1 flags (bit 0: body omitted), 4 body length,
//	              uvarint names, uvarint values, then per name: uvarint
//	              length, name, uvarint count, per value: uvarint length,
//	              value; then the body, to the end of the record.
//
// Versions 2 and 3 keep no lease time: an in-flight record expires (PX) at
// the end of its lease plus its slack, so the lease has PTTL - slack
// milliseconds left, by the server's own clock, read by no command. They
// write header names in increasing order, so that a response has one
// encoding and a record that decodes re-encodes to the same bytes; version 1
// wrote them in any order. Version 3 adds what an operator asks of a record
// (engine.Record): how many holders abandoned it, and when it was first
// claimed.
const (
	recordVersion = 3
	// v2Version and legacyVersion are the previous layouts, written by
	// earlier releases: still read, never written.
	v2Version     = 2
	legacyVersion = 1
	recordHeader  = 42
	// oldHeader is the header's size in versions 1 and 2.
	oldHeader = 30

	stateInFlight  = 1
	stateCompleted = 2
	stateReleased  = 3
	// stateSteps is in flight, with steps in the record's steps key
	// (version 3 only).
	stateSteps = 4

	flagBodyOmitted = 1 << 0
	// responseFixed is the size of status, flags and body length.
	responseFixed = 7
)

// headerSize returns the size of the header of a record of version v.
func headerSize(v byte) int {
	if v == recordVersion {
		return recordHeader
	}
	return oldHeader
}

// ErrCorruptRecord is returned, wrapped, when a record cannot be decoded: an
// unknown version, a truncated value, a key holding something else. It is a
// store error: such a record is never replayed, and the middleware answers
// 503 for its ID until it expires or an operator deletes it (see
// Store.RecordKey).
var ErrCorruptRecord = errors.New("corrupt idempotency record")

// record is a record decoded.
type record struct {
	version     byte
	state       byte
	token       engine.Token
	nonce       uint64
	slack       int64  // versions 2 and 3: ms the record outlives its lease
	leaseEnd    int64  // version 1: the lease's end, µs since the epoch
	abandoned   uint32 // version 3: holders that lost the lease before
	created     int64  // version 3: first claimed, ms since the epoch
	fingerprint string
	response    *engine.Response // completed only
}

// recordKey encodes id after prefix as the scope's length in decimal, ":",
// the scope, ":", the key. The length says where the scope ends whatever bytes
// it holds, so no two IDs share a key: ("a:b", "c") is "3:a:b:c" and
// ("a", "b:c") is "1:a:b:c".
func recordKey(prefix string, id engine.ID) string {
	var n [20]byte
	var b strings.Builder
	b.Grow(len(prefix) + len(n) + 2 + len(id.Scope) + len(id.Key))
	b.WriteString(prefix)
	b.Write(strconv.AppendUint(n[:0], uint64(len(id.Scope)), 10))
	b.WriteByte(':')
	b.WriteString(id.Scope)
	b.WriteByte(':')
	b.WriteString(id.Key)
	return b.String()
}

// appendHead appends the first 26 bytes of a header of version v (3 or 2):
// up to the fingerprint's length.
func appendHead(b []byte, v, state byte, token engine.Token, nonce uint64, slack int64) []byte {
	b = append(b, v, state)
	b = binary.BigEndian.AppendUint64(b, uint64(token))
	b = binary.BigEndian.AppendUint64(b, nonce)
	return binary.BigEndian.AppendUint64(b, uint64(slack))
}

// encodeRecord encodes r in its version's layout, in one allocation. Only
// tests write versions 1 and 2.
func encodeRecord(r record) ([]byte, error) {
	if uint64(len(r.fingerprint)) > math.MaxUint32 {
		return nil, fmt.Errorf("fingerprint of %d bytes too large", len(r.fingerprint))
	}
	if (r.response != nil) != (r.state == stateCompleted) {
		return nil, fmt.Errorf("a record in state %d with a response: %t", r.state, r.response != nil)
	}
	size := headerSize(r.version) + len(r.fingerprint)
	if r.response != nil {
		n, err := responseSize(r.response)
		if err != nil {
			return nil, err
		}
		size += n
	}
	b := make([]byte, 0, size)
	switch r.version {
	case recordVersion, v2Version:
		b = appendHead(b, r.version, r.state, r.token, r.nonce, r.slack)
	case legacyVersion:
		b = append(b, legacyVersion, r.state)
		b = binary.BigEndian.AppendUint64(b, uint64(r.token))
		b = binary.BigEndian.AppendUint64(b, uint64(r.leaseEnd))
		b = binary.BigEndian.AppendUint64(b, r.nonce)
	default:
		return nil, fmt.Errorf("unknown record version %d", r.version)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.fingerprint)))
	if r.version == recordVersion {
		b = binary.BigEndian.AppendUint32(b, r.abandoned)
		b = binary.BigEndian.AppendUint64(b, uint64(r.created))
	}
	b = append(b, r.fingerprint...)
	if r.response != nil {
		b = appendResponse(b, r.response)
	}
	return b, nil
}

// responseSize checks that resp can be encoded and returns its size.
func responseSize(resp *engine.Response) (int, error) {
	if resp.Status < 0 || resp.Status > math.MaxUint16 {
		return 0, fmt.Errorf("status %d out of range", resp.Status)
	}
	if uint64(len(resp.Body)) > math.MaxUint32 {
		return 0, fmt.Errorf("body of %d bytes too large", len(resp.Body))
	}
	values := 0
	size := responseFixed + len(resp.Body)
	for name, vs := range resp.Header {
		values += len(vs)
		size += uvarintLen(len(name)) + len(name) + uvarintLen(len(vs))
		for _, v := range vs {
			size += uvarintLen(len(v)) + len(v)
		}
	}
	return size + uvarintLen(len(resp.Header)) + uvarintLen(values), nil
}

// encodeResponse encodes resp as it follows the fingerprint in a completed
// record, in one allocation.
func encodeResponse(resp *engine.Response) ([]byte, error) {
	if resp == nil {
		return nil, errors.New("nil response")
	}
	size, err := responseSize(resp)
	if err != nil {
		return nil, err
	}
	return appendResponse(make([]byte, 0, size), resp), nil
}

// appendResponse appends resp, which responseSize accepted, names in
// increasing order.
func appendResponse(b []byte, resp *engine.Response) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(resp.Status))
	var flags byte
	if resp.BodyOmitted {
		flags |= flagBodyOmitted
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, uint32(len(resp.Body)))
	values := 0
	names := make([]string, 0, len(resp.Header))
	for name, vs := range resp.Header {
		names = append(names, name)
		values += len(vs)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	b = binary.AppendUvarint(b, uint64(values))
	for _, name := range names {
		vs := resp.Header[name]
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, resp.Body...)
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// decodeRecord decodes a record of either version, in any state. It accepts
// exactly what encodeRecord writes: a record that decodes encodes to the same
// bytes, but for the order of a version 1 record's header names. The strings
// it returns do not share memory with rec, so that a large record is not kept
// alive by its headers.
func decodeRecord(rec string) (record, error) {
	if len(rec) < oldHeader {
		return record{}, corrupt("truncated record header (%d bytes)", len(rec))
	}
	r := record{version: rec[0], state: rec[1], token: engine.Token(beUint64(rec[2:]))}
	hdr := headerSize(r.version)
	switch r.version {
	case recordVersion:
		if len(rec) < recordHeader {
			return record{}, corrupt("truncated record header (%d bytes)", len(rec))
		}
		r.abandoned = binary.BigEndian.Uint32([]byte(rec[30:34]))
		r.created = int64(beUint64(rec[34:]))
		fallthrough
	case v2Version:
		r.nonce, r.slack = beUint64(rec[10:]), int64(beUint64(rec[18:]))
	case legacyVersion:
		r.leaseEnd, r.nonce = int64(beUint64(rec[10:])), beUint64(rec[18:])
	default:
		return record{}, corrupt("unknown record version %d", r.version)
	}
	if r.state < stateInFlight || r.state > stateSteps || r.state == stateSteps && r.version != recordVersion {
		return record{}, corrupt("unknown record state %d", r.state)
	}
	fpLen := uint64(binary.BigEndian.Uint32([]byte(rec[26:30])))
	rest := uint64(len(rec) - hdr)
	if r.state != stateCompleted {
		if fpLen != rest {
			return record{}, corrupt("malformed record in state %d", r.state)
		}
		r.fingerprint = strings.Clone(rec[hdr:])
		return r, nil
	}
	if fpLen+responseFixed > rest {
		return record{}, corrupt("truncated record")
	}
	fixed := rec[hdr+int(fpLen):]
	bodyLen := uint64(binary.BigEndian.Uint32([]byte(fixed[3:7])))
	if bodyLen > uint64(len(fixed)-responseFixed) {
		return record{}, corrupt("truncated response body")
	}
	metaEnd := len(rec) - int(bodyLen)
	// One copy of everything but the body, sliced below.
	meta := strings.Clone(rec[hdr:metaEnd])
	r.fingerprint, meta = meta[:fpLen], meta[fpLen:]
	resp := &engine.Response{
		Status:      int(binary.BigEndian.Uint16([]byte(meta[0:2]))),
		BodyOmitted: meta[2]&flagBodyOmitted != 0,
	}
	if meta[2]&^flagBodyOmitted != 0 {
		return record{}, corrupt("unknown response flags %#x", meta[2])
	}
	var err error
	if resp.Header, err = decodeHeader(meta[responseFixed:], r.version != legacyVersion); err != nil {
		return record{}, err
	}
	if bodyLen > 0 {
		resp.Body = []byte(rec[metaEnd:])
	}
	r.response = resp
	return r, nil
}

func beUint64(s string) uint64 { return binary.BigEndian.Uint64([]byte(s[:8])) }

// decodeHeader decodes the names and values of a response, which must take
// all of s; sorted requires the names in increasing order. The values share
// one backing array, each slice capped so that an append to one cannot
// overwrite the next.
func decodeHeader(s string, sorted bool) (map[string][]string, error) {
	d := decoder{s: s}
	names, values := d.uvarint(), d.uvarint()
	// Every name and value takes at least a byte: bound the allocations by
	// what the record can hold.
	if d.err != nil || names > uint64(len(d.s)) || values > uint64(len(d.s)) {
		return nil, corrupt("malformed response header counts")
	}
	if names == 0 {
		if values != 0 || len(d.s) != 0 {
			return nil, corrupt("malformed response header")
		}
		return nil, nil
	}
	h := make(map[string][]string, names)
	all := make([]string, values)
	used := uint64(0)
	prev := ""
	for i := range names {
		name := d.str()
		n := d.uvarint()
		if d.err != nil || n > values-used {
			return nil, corrupt("malformed response header")
		}
		if sorted && i > 0 && name <= prev {
			return nil, corrupt("response header %q out of order", name)
		}
		prev = name
		vs := all[used : used+n : used+n]
		for i := range vs {
			vs[i] = d.str()
		}
		used += n
		if _, dup := h[name]; dup {
			return nil, corrupt("duplicate response header %q", name)
		}
		h[name] = vs
	}
	if d.err != nil || used != values || len(d.s) != 0 {
		return nil, corrupt("malformed response header")
	}
	return h, nil
}

// decoder reads uvarints in their shortest form and length-prefixed strings;
// after the first error it returns zero values and keeps the error.
type decoder struct {
	s   string
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	var x uint64
	for i := 0; i < len(d.s) && i < binary.MaxVarintLen64; i++ {
		c := d.s[i]
		if c < 0x80 {
			// A last byte of zero after others is a longer form of a
			// shorter number.
			if i == binary.MaxVarintLen64-1 && c > 1 || i > 0 && c == 0 {
				break
			}
			d.s = d.s[i+1:]
			return x | uint64(c)<<(7*i)
		}
		x |= uint64(c&0x7f) << (7 * i)
	}
	d.err = corrupt("malformed varint")
	return 0
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.s)) {
		d.err = corrupt("truncated string")
		return ""
	}
	v := d.s[:n]
	d.s = d.s[n:]
	return v
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorruptRecord}, args...)...)
}
