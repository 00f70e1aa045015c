package localfleet

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/fleetlimit/caddy-fleetlimit"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestPrefetchSiteAdapts: the site text of the cases is a Caddyfile that
// Caddy adapts, with one zone per case holding the case's rule, `key
// global`, and its path.
func TestPrefetchSiteAdapts(t *testing.T) {
	t.Parallel()
	cases := PrefetchCases()
	store := "redis {\n\t\t\taddress 127.0.0.1:6379\n\t\t}"
	caddyfile := "{\n\tadmin off\n}\n\nhttp://127.0.0.1:8080 {" + PrefetchSite(store, cases) + "\n}\n"
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("adapting:\n%s\n%v %v", caddyfile, err, warnings)
	}
	var doc struct {
		Apps struct {
			HTTP struct {
				Servers map[string]json.RawMessage `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfg, &doc); err != nil {
		t.Fatal(err)
	}
	// The handler sits in a subroute of the site's route; look for the
	// zones anywhere in the config.
	text := string(cfg)
	for _, c := range cases {
		for _, want := range []string{
			fmt.Sprintf(`"name":"%s"`, c.Zone),
			fmt.Sprintf(`"prefetch":%d`, c.Prefetch),
			fmt.Sprintf(`"burst":%d`, c.Burst),
			fmt.Sprintf(`"/%s"`, c.Zone),
		} {
			if !strings.Contains(text, want) {
				t.Errorf("case %s: %s missing from the adapted config:\n%s", c.Zone, want, cfg)
			}
		}
	}
	if len(doc.Apps.HTTP.Servers) != 1 {
		t.Errorf("adapted config has %d servers, want 1:\n%s", len(doc.Apps.HTTP.Servers), cfg)
	}
}

// TestScriptCalls counts the EVALSHA calls of a real Redis: none at start,
// then each one, and not EVAL.
func TestScriptCalls(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	if n, err := ScriptCalls(r); err != nil || n != 0 {
		t.Fatalf("ScriptCalls of a new Redis = %d, %v; want 0", n, err)
	}
	sha := r.MustDo("SCRIPT", "LOAD", "return 1")
	for range 3 {
		r.MustDo("EVALSHA", sha, "0")
	}
	r.MustDo("EVAL", "return 2", "0")
	if n, err := ScriptCalls(r); err != nil || n != 3 {
		t.Fatalf("ScriptCalls after 3 EVALSHA and 1 EVAL = %d, %v; want 3", n, err)
	}
}

// openReport is an open-loop report of one run of case c at load: tokens
// admitted of requests against the bound, due requests dropped, and the
// 99th percentile of lateness.
func openReport(c PrefetchCase, load float64, requests, tokens int64, bound float64, dropped int64, late time.Duration) *OpenReport {
	b := &Bucket{Zone: c.Zone, Key: "global", Rate: c.Rate, Per: time.Second, Burst: c.Burst, Saturated: load > 1}
	tg := &Target{Name: c.Zone, Path: "/" + c.Zone, Cost: 1, Buckets: []*Bucket{b}}
	s := newTargetStats(3)
	s.Requests, s.Admitted, s.Tokens = requests, tokens, tokens
	bs := &BucketStats{Bucket: b, Tokens: tokens, Requests: requests, Bound: bound, Ratio: float64(tokens) / bound, Reachable: bound - 2, PerNode: make([]int64, 3)}
	return &OpenReport{
		Report:  &Report{Nodes: 3, Targets: map[*Target]*TargetStats{tg: s}, Buckets: []*BucketStats{bs}},
		Dropped: dropped, LateP99: late, target: tg,
	}
}

// TestPrefetchRow: a row's figures come from the run's report and the
// calls; it is above the bound when the admitted tokens pass the bound's
// whole part, and clean when nothing was dropped and the 99th percentile
// was late by at most half the burst's refill (50 ms for 5000/s, burst
// 500).
func TestPrefetchRow(t *testing.T) {
	t.Parallel()
	c := PrefetchCases()[0]
	pf := []limiter.PrefetchStats{{Hits: 1}, {Hits: 2}, {Hits: 3}}
	for _, tc := range []struct {
		name          string
		tokens        int64
		bound         float64
		dropped       int64
		late          time.Duration
		over, clean   bool
		callsPerAdmit float64
	}{
		{name: "under", tokens: 15000, bound: 15500.9, late: 50 * time.Millisecond, clean: true, callsPerAdmit: 0.025},
		{name: "at the whole part", tokens: 15500, bound: 15500.9, late: time.Millisecond, clean: true, callsPerAdmit: 375.0 / 15500},
		{name: "above", tokens: 15501, bound: 15500.9, late: time.Millisecond, over: true, clean: true, callsPerAdmit: 375.0 / 15501},
		{name: "late", tokens: 15000, bound: 15500.9, late: 50*time.Millisecond + 1, callsPerAdmit: 0.025},
		{name: "dropped", tokens: 15000, bound: 15500.9, dropped: 1, late: time.Millisecond, callsPerAdmit: 0.025},
	} {
		rep := openReport(c, 1.5, 22500, tc.tokens, tc.bound, tc.dropped, tc.late)
		row := prefetchRow(rep, c, 1.5, 375, pf)
		if row.OverBound != tc.over || row.Clean != tc.clean {
			t.Errorf("%s: over bound %v, clean %v; want %v, %v", tc.name, row.OverBound, row.Clean, tc.over, tc.clean)
		}
		if d := row.CallsPerAdmitted - tc.callsPerAdmit; d > 1e-12 || d < -1e-12 {
			t.Errorf("%s: %.6f calls per admitted, want %.6f", tc.name, row.CallsPerAdmitted, tc.callsPerAdmit)
		}
		if want := float64(tc.tokens) / tc.bound; row.AdmittedBound != want {
			t.Errorf("%s: admitted/bound %.6f, want %.6f", tc.name, row.AdmittedBound, want)
		}
		if want := float64(tc.tokens) / (tc.bound - 2); row.AdmittedReachable != want {
			t.Errorf("%s: admitted/reachable %.6f, want %.6f", tc.name, row.AdmittedReachable, want)
		}
		if row.Stats.Requests != 22500 || row.Nodes[2].Hits != 3 || row.Case != c || row.Load != 1.5 {
			t.Errorf("%s: row %+v does not carry the run's stats, case and load", tc.name, row)
		}
		if row.AllAdmitted() {
			t.Errorf("%s: %d of 22500 admitted, and AllAdmitted says all", tc.name, tc.tokens)
		}
	}
}

// TestPrefetchRowNothingAnswered: a run whose requests all went
// unanswered gives a row with nothing admitted, not a panic.
func TestPrefetchRowNothingAnswered(t *testing.T) {
	t.Parallel()
	c := PrefetchCases()[1]
	rep := openReport(c, 3, 0, 0, 200, 500, time.Second)
	rep.Targets, rep.Buckets = map[*Target]*TargetStats{}, nil
	row := prefetchRow(rep, c, 3, 0, make([]limiter.PrefetchStats, 3))
	if row.Stats.Requests != 0 || row.Bucket.Tokens != 0 || row.OverBound || row.Clean || row.AdmittedBound != 0 {
		t.Errorf("row of a run without answers: %+v, bucket %+v", row, row.Bucket)
	}
}
