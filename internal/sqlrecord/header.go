package sqlrecord

import (
	"encoding/binary"
	"errors"
	"slices"
)

// Stored headers are bytes (bytea in PostgreSQL, BLOBs in SQLite and MySQL)
// in a compact encoding of their own, shared by the SQL stores, because
// jsonb and text cannot hold every byte a header value may carry (NUL,
// invalid UTF-8): a version byte, the number of names, then for each name
// in sorted order its length and bytes, its number of values, and each value's length
// and bytes, every number an unsigned varint. Values keep their order. A nil
// http.Header is stored as NULL, so that nil and empty both round-trip.
const headerVersion = 1

// ErrCorruptHeader is returned by DecodeHeader for bytes that EncodeHeader
// did not write.
var ErrCorruptHeader = errors.New("corrupt stored headers")

// EncodeHeader encodes h; nil stays nil.
func EncodeHeader(h map[string][]string) []byte {
	if h == nil {
		return nil
	}
	size := 1 + binary.MaxVarintLen64
	names := make([]string, 0, len(h))
	for k, vs := range h {
		names = append(names, k)
		size += 2*binary.MaxVarintLen64 + len(k)
		for _, v := range vs {
			size += binary.MaxVarintLen64 + len(v)
		}
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, headerVersion)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		vs := h[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// DecodeHeader decodes what EncodeHeader wrote.
func DecodeHeader(b []byte) (map[string][]string, error) {
	if b == nil {
		return nil, nil
	}
	if len(b) == 0 || b[0] != headerVersion {
		return nil, ErrCorruptHeader
	}
	d := headerDecoder{b: b[1:]}
	n := d.count()
	h := make(map[string][]string, n)
	prev := ""
	for i := range n {
		k := d.string()
		if i > 0 && k <= prev {
			return nil, ErrCorruptHeader // names are sorted and distinct
		}
		prev = k
		m := d.count()
		vs := make([]string, m)
		for j := range vs {
			vs[j] = d.string()
		}
		h[k] = vs
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, ErrCorruptHeader
	}
	return h, nil
}

// headerDecoder reads the encoding; after its first error it reads nothing
// more and returns zero values.
type headerDecoder struct {
	b   []byte
	err error
}

func (d *headerDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = ErrCorruptHeader
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a number of items, each of which takes at least one byte, so
// that corrupt input cannot make the decoder allocate more than its length.
func (d *headerDecoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.b)) {
		d.err = ErrCorruptHeader
		return 0
	}
	return int(v)
}

func (d *headerDecoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = ErrCorruptHeader
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
