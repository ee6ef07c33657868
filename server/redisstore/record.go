package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemkit/idempotency/server"
)

// The record layout, version 1. The fixed header is what the scripts read
// (with Lua's struct.unpack); the response that follows the fingerprint in a
// completed record is opaque to them and decoded here. Integers are
// big-endian.
//
//	offset  size  field
//	0       1     version (1)
//	1       1     state: 1 in flight, 2 completed, 3 released
//	2       8     fencing token
//	10      8     lease end, µs since the epoch by the Redis server's clock
//	18      8     nonce of the call that last changed the state
//	26      4     fingerprint length n
//	30      n     fingerprint
//	30+n          response (completed only):
//	              2 status, 1 flags (bit 0: body omitted), 4 body length,
//	              uvarint names, uvarint values, then per name: uvarint
//	              length, name, uvarint count, per value: uvarint length,
//	              value; then the body, to the end of the record.
const (
	recordVersion  = 1
	recordHeader   = 30
	stateCompleted = 2

	flagBodyOmitted = 1 << 0
	// responseFixed is the size of status, flags and body length.
	responseFixed = 7
	nonceLen      = 8
)

// ErrCorruptRecord is returned, wrapped, when a record cannot be decoded: an
// unknown version, a truncated value, a key holding something else. It is a
// store error: such a record is never replayed, and the middleware answers
// 503 for its ID until it expires or an operator deletes it (see
// Store.RecordKey).
var ErrCorruptRecord = errors.New("corrupt idempotency record")

// recordKey encodes id after prefix as the scope's length in decimal, ":",
// the scope, ":", the key. The length says where the scope ends whatever bytes
// it holds, so no two IDs share a key: ("a:b", "c") is "3:a:b:c" and
// ("a", "b:c") is "1:a:b:c".
func recordKey(prefix string, id server.ID) string {
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

// encodeResponse encodes resp as it follows the fingerprint in a completed
// record, in one allocation.
func encodeResponse(resp *server.Response) ([]byte, error) {
	if resp == nil {
		return nil, errors.New("nil response")
	}
	if resp.Status < 0 || resp.Status > math.MaxUint16 {
		return nil, fmt.Errorf("status %d out of range", resp.Status)
	}
	if uint64(len(resp.Body)) > math.MaxUint32 {
		return nil, fmt.Errorf("body of %d bytes too large", len(resp.Body))
	}
	values := 0
	size := responseFixed + 2*binary.MaxVarintLen64 + len(resp.Body)
	for name, vs := range resp.Header {
		values += len(vs)
		size += uvarintLen(len(name)) + len(name) + uvarintLen(len(vs))
		for _, v := range vs {
			size += uvarintLen(len(v)) + len(v)
		}
	}
	b := make([]byte, 0, size)
	b = binary.BigEndian.AppendUint16(b, uint16(resp.Status))
	var flags byte
	if resp.BodyOmitted {
		flags |= flagBodyOmitted
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, uint32(len(resp.Body)))
	b = binary.AppendUvarint(b, uint64(len(resp.Header)))
	b = binary.AppendUvarint(b, uint64(values))
	for name, vs := range resp.Header {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, resp.Body...), nil
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// decodeCompleted decodes a completed record, whole, as the claim script
// returns it. The strings it returns do not share memory with rec, so that a
// large record is not kept alive by its headers.
func decodeCompleted(rec string) (fingerprint string, resp *server.Response, err error) {
	if len(rec) < recordHeader {
		return "", nil, corrupt("truncated record header (%d bytes)", len(rec))
	}
	if rec[0] != recordVersion {
		return "", nil, corrupt("unknown record version %d", rec[0])
	}
	if rec[1] != stateCompleted {
		return "", nil, corrupt("record state %d, want completed", rec[1])
	}
	fpLen := uint64(binary.BigEndian.Uint32([]byte(rec[26:30])))
	if fpLen+responseFixed > uint64(len(rec)-recordHeader) {
		return "", nil, corrupt("truncated record")
	}
	fixed := rec[recordHeader+int(fpLen):]
	bodyLen := uint64(binary.BigEndian.Uint32([]byte(fixed[3:7])))
	if bodyLen > uint64(len(fixed)-responseFixed) {
		return "", nil, corrupt("truncated response body")
	}
	metaEnd := len(rec) - int(bodyLen)
	// One copy of everything but the body, sliced below.
	meta := strings.Clone(rec[recordHeader:metaEnd])
	fingerprint, meta = meta[:fpLen], meta[fpLen:]
	resp = &server.Response{
		Status:      int(binary.BigEndian.Uint16([]byte(meta[0:2]))),
		BodyOmitted: meta[2]&flagBodyOmitted != 0,
	}
	if meta[2]&^flagBodyOmitted != 0 {
		return "", nil, corrupt("unknown response flags %#x", meta[2])
	}
	if resp.Header, err = decodeHeader(meta[responseFixed:]); err != nil {
		return "", nil, err
	}
	if bodyLen > 0 {
		resp.Body = []byte(rec[metaEnd:])
	}
	return fingerprint, resp, nil
}

// decodeHeader decodes the names and values of a response, which must take
// all of s. The values share one backing array, each slice capped so that an
// append to one cannot overwrite the next.
func decodeHeader(s string) (http.Header, error) {
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
	h := make(http.Header, names)
	all := make([]string, values)
	used := uint64(0)
	for range names {
		name := d.str()
		n := d.uvarint()
		if d.err != nil || n > values-used {
			return nil, corrupt("malformed response header")
		}
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

// decoder reads uvarints and length-prefixed strings; after the first error
// it returns zero values and keeps the error.
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
			if i == binary.MaxVarintLen64-1 && c > 1 {
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
