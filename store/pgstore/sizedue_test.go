package pgstore

import (
	"testing"
	"time"
)

// A Claim reads the table's size first, and then once a sizeInterval.
func TestSizeDue(t *testing.T) {
	var s store
	if !s.sizeDue() {
		t.Fatal("first sizeDue() = false, want true")
	}
	if s.sizeDue() {
		t.Error("sizeDue() right after = true, want false")
	}
	s.sizedAt.Store(time.Now().Add(-sizeInterval).UnixNano())
	if !s.sizeDue() {
		t.Error("sizeDue() a sizeInterval later = false, want true")
	}
	if s.sizeDue() {
		t.Error("sizeDue() right after that = true, want false")
	}
}
