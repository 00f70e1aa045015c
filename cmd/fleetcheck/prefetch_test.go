package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestParseCases reads -prefetch-case: RATE/BURST/PREFETCH with the calls
// target of the fleet's size, or an explicit fourth field; anything else
// is refused.
func TestParseCases(t *testing.T) {
	got, err := parseCases("20000/2000/100, 2000/200/20/0.3,1000/100/10", 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []localfleet.PrefetchCase{
		{Zone: "case1", Rate: 20000, Burst: 2000, Prefetch: 100, MaxCalls: 0.05},
		{Zone: "case2", Rate: 2000, Burst: 200, Prefetch: 20, MaxCalls: 0.3},
		{Zone: "case3", Rate: 1000, Burst: 100, Prefetch: 10, MaxCalls: 0.4},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseCases = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "20000/2000", "20000/2000/100/0.05/1", "a/2000/100", "20000/0/100", "20000/2000/-1", "20000/2000/100/0"} {
		if cs, err := parseCases(bad, 3); err == nil {
			t.Errorf("parseCases(%q) = %+v, want an error", bad, cs)
		}
	}
}

// TestCaseMaxCalls: the default cases' targets follow from the rule for
// three nodes: 0.05 for prefetch 100 (where the pacing settles at 0.04)
// and 0.2 for prefetch 20.
func TestCaseMaxCalls(t *testing.T) {
	for _, c := range localfleet.PrefetchCases() {
		if got := caseMaxCalls(c.Prefetch, 3); got != c.MaxCalls {
			t.Errorf("caseMaxCalls(%d, 3) = %g, want the default case's %g", c.Prefetch, got, c.MaxCalls)
		}
	}
	if got := caseMaxCalls(100, 9); got != 0.1 {
		t.Errorf("caseMaxCalls(100, 9) = %g, want 0.1", got)
	}
}

// TestParseLoads reads -loads and refuses what is not a positive number.
func TestParseLoads(t *testing.T) {
	got, err := parseLoads("0.5,1.05, 1.5,3")
	if err != nil || !slices.Equal(got, []float64{0.5, 1.05, 1.5, 3}) {
		t.Errorf("parseLoads = %v, %v", got, err)
	}
	for _, bad := range []string{"", "1,,2", "0", "-1", "x"} {
		if l, err := parseLoads(bad); err == nil {
			t.Errorf("parseLoads(%q) = %v, want an error", bad, l)
		}
	}
}

// row makes a row of the hot case at load: requests answered, admitted,
// script calls, the exact bound, and whether the run was clean.
func row(load float64, requests, admitted, calls int64, bound float64, clean bool) *localfleet.PrefetchRow {
	c := localfleet.PrefetchCases()[0]
	s := &localfleet.TargetStats{Requests: requests, Admitted: admitted, Tokens: admitted}
	b := &localfleet.BucketStats{Bucket: &localfleet.Bucket{Zone: c.Zone, Rate: c.Rate, Per: time.Second, Burst: c.Burst}, Tokens: admitted, Bound: bound, Reachable: bound - 1}
	r := &localfleet.PrefetchRow{
		OpenReport: &localfleet.OpenReport{Report: &localfleet.Report{}, Offered: load * float64(c.Rate), LateP99: time.Millisecond},
		Case:       c, Load: load, Stats: s, Bucket: b, Calls: calls,
		CallsPerAdmitted: float64(calls) / float64(max(admitted, 1)),
		AdmittedBound:    float64(admitted) / bound, AdmittedReachable: float64(admitted) / (bound - 1),
		OverBound: float64(admitted) > bound, Clean: clean,
		Nodes: make([]limiter.PrefetchStats, 3),
	}
	if !clean {
		r.LateP99 = time.Second
	}
	return r
}

// TestJudge: below the rate every request must be admitted; above it the
// calls per admitted request and the share of the bound must meet their
// targets; a target missed on a run that was not clean is excused, a
// broken bound or a failed request never is.
func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		row                       *localfleet.PrefetchRow
		allAdmitted, calls, bound string
		failures, excused         int
	}{
		{name: "below, all admitted", row: row(0.5, 7500, 7500, 150, 15500, true), allAdmitted: "met"},
		{name: "below, one denied", row: row(0.5, 7500, 7499, 150, 15500, true), allAdmitted: "not met", failures: 1},
		{name: "below, one denied, not clean", row: row(0.5, 7500, 7499, 150, 15500, false), allAdmitted: "not met", excused: 1},
		{name: "above, met", row: row(1.5, 22500, 15300, 400, 15500, true), calls: "met", bound: "met"},
		{name: "above, too many calls", row: row(1.5, 22500, 15300, 800, 15500, true), calls: "not met", bound: "met", failures: 1},
		{name: "above, too few admitted", row: row(1.5, 22500, 15000, 400, 15500, true), calls: "met", bound: "not met", failures: 1},
		{name: "above, both missed, not clean", row: row(3, 45000, 15000, 800, 15500, false), calls: "not met", bound: "not met", excused: 2},
		{name: "above the bound", row: row(3, 45000, 15501, 400, 15500, false), calls: "met", bound: "not met", failures: 1},
		{name: "at the rate: the bound only", row: row(1, 15000, 15000, 400, 15500, true)},
	} {
		j := judge(tc.row)
		if j.allAdmitted != tc.allAdmitted || j.calls != tc.calls || j.bound != tc.bound {
			t.Errorf("%s: marks all admitted %q, calls %q, bound %q; want %q, %q, %q", tc.name, j.allAdmitted, j.calls, j.bound, tc.allAdmitted, tc.calls, tc.bound)
		}
		if len(j.failures) != tc.failures || len(j.excused) != tc.excused {
			t.Errorf("%s: failures %q, excused %q; want %d and %d", tc.name, j.failures, j.excused, tc.failures, tc.excused)
		}
	}
	r := row(1.5, 22500, 15300, 400, 15500, true)
	r.Stats.FailedOpen = 3
	if j := judge(r); len(j.failures) != 1 || !strings.Contains(j.failures[0], "failed open") {
		t.Errorf("a run with requests failed open: failures %q, want one", j.failures)
	}
}

// TestPrefetchTable renders a case's rows with their marks: the figure a
// target applies to carries "met" or "not met", the others none.
func TestPrefetchTable(t *testing.T) {
	rows := []*localfleet.PrefetchRow{row(0.5, 7500, 7500, 150, 15500, true), row(1.5, 22500, 15000, 400, 15500, false)}
	js := []judgement{judge(rows[0]), judge(rows[1])}
	got := prefetchTable(rows[0].Case, rows, js)
	for _, want := range []string{
		"hot: rate 5000/s, burst 500, prefetch 100. Targets:",
		"at most 0.05 script calls per admitted request and admitted within [0.97, 1.000] of the exact bound",
		"| 0.5x | 2500 | 0 | 0 | 1ms | yes | 7500 | 7500 (met) | 150 | 0.0200 | 0.4839 | 0.4839 |",
		"| 1.5x | 7500 | 0 | 0 | 1s | no | 22500 | 15000 | 400 | 0.0267 (met) | 0.9677 (not met) | 0.9678 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(prefetchNodeTable(rows), "\n"); n != 2+2*3 {
		t.Errorf("node table has %d lines, want a header of 2 and 3 nodes for each of 2 rows:\n%s", n, prefetchNodeTable(rows))
	}
}
