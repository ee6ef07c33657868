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

func TestNewRatio(t *testing.T) {
	if r := benchreport.NewRatio(nil); r != nil {
		t.Errorf("NewRatio(nil) = %+v, want nil", r)
	}
	r := benchreport.NewRatio([]float64{1.2, 0.9, 1.0, 1.1})
	if r == nil || r.Median != 1.05 || r.Min != 0.9 || r.Max != 1.2 || len(r.Rounds) != 4 {
		t.Errorf("NewRatio = %+v, want median 1.05, range 0.9–1.2, 4 rounds", r)
	}
}

// An A/B report's variants and comparisons survive a write and a read.
func TestRoundTripComparisons(t *testing.T) {
	in := &benchreport.Report{
		Variants: []benchreport.Variant{{Name: "this", Source: benchreport.VariantTree}, {Name: "main", Source: benchreport.VariantRevision, Commit: "abc"}},
		Phases: []benchreport.Phase{{
			Records: 1, Concurrency: 2, Store: "redis main", Variant: "main", Kind: benchreport.KindFirst,
			Rounds: []benchreport.Measure{{Requests: 1}},
		}},
		Comparisons: []benchreport.Comparison{{
			Records: 1, Concurrency: 2, Store: benchreport.Redis, Kind: benchreport.KindFirst, Over: "main",
			PerSecond: benchreport.NewRatio([]float64{1, 2}),
		}},
	}
	var buf bytes.Buffer
	if err := in.Write(&buf); err != nil {
		t.Fatal(err)
	}
	out, err := benchreport.Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Variants) != 2 || out.Variants[1].Commit != "abc" || out.Phases[0].Variant != "main" {
		t.Errorf("read back: variants %+v, phase variant %q", out.Variants, out.Phases[0].Variant)
	}
	if len(out.Comparisons) != 1 || out.Comparisons[0].PerSecond == nil || out.Comparisons[0].PerSecond.Median != 1.5 || out.Comparisons[0].ServerCPU != nil {
		t.Errorf("read back: comparisons %+v, want one, req/s median 1.5, no server CPU", out.Comparisons)
	}
}
