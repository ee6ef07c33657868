package benchreport_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/internal/cmd/benchreport"
)

func ptr(x float64) *float64 { return &x }

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := benchreport.Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestMedianOf(t *testing.T) {
	ms := []benchreport.Measure{
		{Requests: 10, PerSecond: 100, ServerCPU: 30, StoreCPU: ptr(5)},
		{Requests: 30, PerSecond: 300, ServerCPU: 10},
		{Requests: 20, PerSecond: 200, ServerCPU: 20, StoreCPU: ptr(7)},
	}
	got := benchreport.MedianOf(ms)
	if got.Requests != 20 || got.PerSecond != 200 || got.ServerCPU != 20 {
		t.Errorf("MedianOf = %d requests, %v/s, %v µs; want 20, 200, 20", got.Requests, got.PerSecond, got.ServerCPU)
	}
	if got.StoreCPU == nil || *got.StoreCPU != 6 {
		t.Errorf("MedianOf StoreCPU = %v, want 6 (the median of the rounds that have it)", got.StoreCPU)
	}
	if got.RoundTrips != nil {
		t.Errorf("MedianOf RoundTrips = %v, want nil (no round has it)", *got.RoundTrips)
	}
}

func TestRoundTrip(t *testing.T) {
	in := &benchreport.Report{
		Command: "loadbench -c 1",
		Phases: []benchreport.Phase{{
			Records: 10, Concurrency: 1, Store: benchreport.Redis, Kind: benchreport.KindReplay,
			Rounds: []benchreport.Measure{{Requests: 1, RoundTrips: ptr(1)}},
		}},
	}
	in.Phases[0].Summarize()
	var buf bytes.Buffer
	if err := in.Write(&buf); err != nil {
		t.Fatal(err)
	}
	out, err := benchreport.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	p := out.Find(10, 1, benchreport.Redis, benchreport.KindReplay)
	if p == nil {
		t.Fatal("Find after Read = nil, want the phase")
	}
	if p.Median.RoundTrips == nil || *p.Median.RoundTrips != 1 {
		t.Errorf("round trips after Read = %v, want 1", p.Median.RoundTrips)
	}
	if out.Find(10, 2, benchreport.Redis, benchreport.KindReplay) != nil {
		t.Error("Find of a phase that is not there != nil")
	}
}

func TestReadRefusesUnknownFields(t *testing.T) {
	if _, err := benchreport.Read(strings.NewReader(`{"command":"x","surprise":1}`)); err == nil {
		t.Error("Read of an unknown field: no error")
	}
}
