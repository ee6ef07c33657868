package main

import (
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	tests := []struct {
		name, in string
		want     int64
		wantErr  bool
	}{
		{"summary", "version: 1\nevents: Ir\nsummary: 94685436\ntotals: 94685436\n", 94685436, false},
		{"none", "events: Ir\n", 0, true},
		{"not a number", "summary: x\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := summary(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("summary() = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
