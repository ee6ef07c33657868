package redisstore

import (
	"strings"
	"testing"

	"github.com/idemkit/idempotency/engine"
)

// crc16 is Redis Cluster's CRC-16: the check value of the standard's test
// string, and the slots that Redis's documentation gives.
func TestCRC16(t *testing.T) {
	if got := crc16(0, "123456789"); got != 0x31c3 {
		t.Errorf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, slot := range map[string]uint16{"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "{user1000}.followers": 3443, "foo{}{bar}": 8363, "foo{{bar}}zap": 4015, "foo{bar}{zap}": 5061} {
		if got := keySlot(key); got != slot {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, slot)
		}
	}
}

// slotFill reaches every slot from every CRC, and in a hash tag never with
// a "}": for each of a few slots, every one of the 65,536 CRCs that bytes
// before can leave, which between them give every candidate pair of bytes
// that slotFill chooses from.
func TestSlotFill(t *testing.T) {
	for _, slot := range []uint16{0, 1, 0x7d, 5061, 12182, 1<<14 - 1} {
		for c := range 1 << 16 {
			for _, tag := range []bool{false, true} {
				m := slotFill(uint16(c), slot, tag)
				if len(m) != 2 {
					t.Fatalf("slotFill(%#x, %d, %v) = %q, want two bytes", c, slot, tag, m)
				}
				if got := crc16(uint16(c), m) & (1<<14 - 1); got != slot {
					t.Fatalf("slotFill(%#x, %d, %v) = %q, whose slot is %d", c, slot, tag, m, got)
				}
				if tag && strings.Contains(m, "}") {
					t.Fatalf("slotFill(%#x, %d, true) = %q, which ends the hash tag", c, slot, m)
				}
			}
		}
	}
}

// Every steps key is in its record's slot, under the prefix, never a
// record key, and distinct for each ID, whatever braces the prefix, the
// scope and the key hold. TestStepsKeySlot checks the slots with the
// server's own CLUSTER KEYSLOT.
func TestStepsKeyShape(t *testing.T) {
	keys := map[string]string{}
	for _, prefix := range stepsKeyPrefixes {
		for _, id := range stepsKeyIDs() {
			rk := recordKey(prefix, id)
			sk := stepsKey(prefix, rk)
			if keySlot(sk) != keySlot(rk) {
				t.Errorf("prefix %q, ID %q: steps key %q in slot %d, record key %q in %d", prefix, id, sk, keySlot(sk), rk, keySlot(rk))
			}
			rest, ok := strings.CutPrefix(sk, prefix)
			if !ok || rest == "" || rest[0] >= '0' && rest[0] <= '9' {
				t.Errorf("prefix %q, ID %q: steps key %q is not the prefix and then a non-digit", prefix, id, sk)
			}
			if other, dup := keys[sk]; dup {
				t.Errorf("steps key %q of %s and of %s", sk, other, prefix+" "+id.Scope+" "+id.Key)
			}
			keys[sk] = prefix + " " + id.Scope + " " + id.Key
		}
	}
}

// stepsKeyPrefixes hold braces in every way that decides a slot.
var stepsKeyPrefixes = []string{
	"idempotency:", "", "{idem}:", "{idem}", "idem{", "idem{}:", "{", "}", "}{", "{}", "{}{x}", "a{b}c{", "x{{y}", "{s}",
}

// stepsKeyIDs returns IDs with braces where they change the record key's
// slot, and without.
func stepsKeyIDs() []engine.ID {
	ids := []engine.ID{
		{}, {Key: "k"}, {Scope: "tenant", Key: "order-1"}, {Key: "{"}, {Key: "}"}, {Key: "{}"}, {Key: "{x}"},
		{Scope: "{", Key: "}"}, {Scope: "}", Key: "{"}, {Scope: "a}", Key: "{b}"}, {Scope: "{}", Key: "x"},
		{Key: "}}}{{{"}, {Scope: "\x00\xff", Key: "{\x00}"}, {Key: strings.Repeat("{}", 100)},
	}
	for i := range 256 {
		ids = append(ids, engine.ID{Scope: "s", Key: string([]byte{byte(i), '}', byte(i)})})
	}
	return ids
}
