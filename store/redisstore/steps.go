package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/steps"
)

// SaveStep implements engine.StepStore in one round trip: one function
// call, which checks the lease (the token, in flight) and writes the step
// into the record's steps key, a hash of step name to step; a Store made
// WithReplicaAck sends WAIT with it, as Complete does, and a step that
// fewer replicas acknowledged fails with ErrNotReplicated (the step is on
// the master; the engine tries again). The first step of a record marks the
// record as holding steps, and gives the steps key the record's expiry; the
// last one removed unmarks it. A step of more than steps.MaxSize bytes
// (name, fingerprint and result), or one more than steps.MaxSteps, fails
// with an error wrapping engine.ErrNotStorable and changes nothing.
func (s *store) SaveStep(ctx context.Context, id engine.ID, token engine.Token, step engine.Step) error {
	if err := s.usable(ctx); err != nil {
		return fmt.Errorf("redisstore: save step: %w", err)
	}
	if n := len(step.Name) + len(step.Fingerprint) + len(step.Result); n > steps.MaxSize {
		return fmt.Errorf("redisstore: save step: step %q of %d bytes, over %d: %w", step.Name, n, steps.MaxSize, engine.ErrNotStorable)
	}
	key := s.RecordKey(id)
	return s.update(ctx, "save step", s.lib.step, key, heldBy(token), stepsKey(s.prefix, key), step.Name, encodeStep(step), steps.MaxSteps)
}

// A step is kept in its record's steps key as a field named by the step's
// name, whose value is a byte of flags (bit 0: done), the fingerprint's
// length as a uvarint, the fingerprint and the result. The functions never
// look inside it.
const stepDone = 1 << 0

// encodeStep encodes st as its steps key keeps it, or, for a step without a
// fingerprint, which removes its name's, as the empty string.
func encodeStep(st engine.Step) []byte {
	if st.Fingerprint == "" {
		return nil
	}
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(st.Fingerprint)+len(st.Result))
	var flags byte
	if st.Done {
		flags |= stepDone
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(st.Fingerprint)))
	b = append(b, st.Fingerprint...)
	return append(b, st.Result...)
}

// decodeSteps decodes the steps of a record, as HGETALL answers: names and
// values, in turn.
func decodeSteps(reply any) ([]engine.Step, error) {
	flat, ok := reply.([]any)
	if !ok || len(flat)%2 != 0 {
		return nil, corrupt("steps answered as %T", reply)
	}
	out := make([]engine.Step, 0, len(flat)/2)
	for i := 0; i < len(flat); i += 2 {
		name, ok1 := flat[i].(string)
		v, ok2 := flat[i+1].(string)
		if !ok1 || !ok2 {
			return nil, corrupt("steps answered as %T and %T", flat[i], flat[i+1])
		}
		st, err := decodeStep(name, v)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// decodeStep decodes v, the step named name.
func decodeStep(name, v string) (engine.Step, error) {
	if len(v) < 2 || v[0]&^stepDone != 0 {
		return engine.Step{}, corrupt("malformed step %q", name)
	}
	d := decoder{s: v[1:]}
	n := d.uvarint()
	if d.err != nil || n == 0 || n > uint64(len(d.s)) {
		return engine.Step{}, corrupt("malformed step %q", name)
	}
	st := engine.Step{Name: name, Fingerprint: d.s[:n], Done: v[0]&stepDone != 0}
	if rest := d.s[n:]; rest != "" {
		st.Result = []byte(rest)
	}
	return st, nil
}

// The steps key. A function on a Redis Cluster may only reach keys of the
// slot of the key it was called for, the record's: the steps key must hash
// to the record key's slot. A record key holds no hash tag of its own (only
// one that the prefix, the scope or the key happen to hold), so the steps
// key is made to land there: it is the prefix, then bytes that no record
// key has after the prefix (a record key goes on with a digit, the scope's
// length), then the rest of the record key, which makes it as distinct as
// the record key, and under the prefix that the ACL's key pattern names.
// What follows the prefix depends on how the prefix holds braces (Redis
// hashes the bytes between the first "{" and the first "}" after it, when
// there are any, and the whole key otherwise):
//
//	prefix without "{":           prefix "{s" m "}" rest  (a hash tag of its own)
//	prefix with a whole tag:      prefix "s" rest         (the prefix's tag decides)
//	prefix with "{}":             prefix "s" rest m       (the whole key is hashed)
//	prefix with "{" but no "}":   prefix "s" m "}" rest   (the tag that it opens)
//
// where m is two bytes that make the hashed bytes land on the record's
// slot. CRC-16 is linear: two bytes appended to any bytes can take the CRC
// to any value, and four values of it give each slot.

// stepsKey returns the steps key of the record at key, a record key that
// recordKey made with prefix.
func stepsKey(prefix, key string) string {
	rest := key[len(prefix):]
	open := strings.IndexByte(prefix, '{')
	if open < 0 {
		return prefix + "{s" + slotFill(crc16(0, "s"), keySlot(key), true) + "}" + rest
	}
	switch end := strings.IndexByte(prefix[open+1:], '}'); {
	case end > 0:
		return prefix + "s" + rest
	case end == 0:
		k := prefix + "s" + rest
		return k + slotFill(crc16(0, k), keySlot(key), false)
	default:
		return prefix + "s" + slotFill(crc16(crc16(0, prefix[open+1:]), "s"), keySlot(key), true) + "}" + rest
	}
}

// keySlot returns the Redis Cluster slot of key: the CRC-16 of its hash
// tag, or of all of it when it has none, modulo 16384.
func keySlot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return crc16(0, key[s+1:s+1+e]) & (1<<14 - 1)
		}
	}
	return crc16(0, key) & (1<<14 - 1)
}

// crc16 returns the CRC-16 (XMODEM, Redis Cluster's) of s, from crc: the
// CRC of the bytes before s.
func crc16(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// slotFill returns two bytes that, appended to bytes whose CRC-16 is crc,
// make a CRC-16 that is slot modulo 16384; in a hash tag (tag), two bytes
// without "}", which would end it.
//
// Sixteen bits that follow bytes with CRC c make the CRC of c XOR those
// bits shifted through the register, a bijection: so the bits are c XOR the
// inverse of that shift applied to the CRC wanted. The four CRCs of a slot
// give four candidates that differ from the first by 0x4408, 0x8810 and
// 0xcc18: their high bytes by distinct amounts and their low bytes too, so
// a "}" in either byte rules out at most one candidate each, and one of the
// first three has none.
func slotFill(crc, slot uint16, tag bool) string {
	var m uint16
	for top := range uint16(3) {
		m = crc ^ unshift16(top<<14|slot)
		if !tag || (byte(m>>8) != '}' && byte(m) != '}') {
			break
		}
	}
	return string([]byte{byte(m >> 8), byte(m)})
}

// unshift16 undoes sixteen shifts of the CRC-16 register with zero bits
// in: it returns the register that those shifts take to crc.
func unshift16(crc uint16) uint16 {
	for range 16 {
		if crc&1 != 0 {
			crc = (crc^0x1021)>>1 | 0x8000
		} else {
			crc >>= 1
		}
	}
	return crc
}
