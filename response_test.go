package fleetlimit

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestParseCost: a reported cost is a non-negative integer; one beyond
// int64 counts as the largest (the settlement caps it at the burst), and
// anything else leaves the up-front cost.
func TestParseCost(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want int64
		ok   bool
	}{
		{[]string{"500"}, 500, true},
		{[]string{" 7 "}, 7, true},
		{[]string{"0"}, 0, true},
		{[]string{"9223372036854775807"}, math.MaxInt64, true},
		{[]string{"99999999999999999999999"}, math.MaxInt64, true},
		{[]string{"-5"}, 0, false},
		{[]string{"+5"}, 0, false},
		{[]string{"1e3"}, 0, false},
		{[]string{""}, 0, false},
		{nil, 0, false},
	} {
		if got, ok := parseCost(c.in); got != c.want || ok != c.ok {
			t.Errorf("parseCost(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// streamedCost is a handler that streams a body with X-Tokens-Used
// announced as a trailer: in the header when header is set, and added
// after the body when trailer is, as reverse_proxy copies a trailer.
func streamedCost(header string, trailer string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if header != "" {
			w.Header().Set("X-Tokens-Used", header)
		}
		w.Header().Set("Trailer", "X-Tokens-Used")
		w.WriteHeader(200)
		_, _ = w.Write([]byte("streamed"))
		if trailer != "" {
			w.Header().Add("X-Tokens-Used", trailer)
		}
	}
}

// TestCostRecorder: the recorder reads the cost from the header as the
// status is written (a later removal of the header does not matter), and
// from a trailer, announced or prefixed, which wins over the header, also
// when reverse_proxy adds its values after the header's. A response that
// ended before it reported its cost (unfinished: its client left, its
// stream aborted, a HEAD) is costUnfinished, with the header's provisional
// cost, unless the header reported it and announced no trailer.
func TestCostRecorder(t *testing.T) {
	zone := &Zone{costHeader: "X-Tokens-Used"}
	ds := []zoneDecision{{zone: zone}}
	cases := []struct {
		name       string
		handler    func(w http.ResponseWriter)
		unfinished bool
		want       int64
		state      costState
	}{
		{"header", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "500")
			w.WriteHeader(200)
			w.Header().Del("X-Tokens-Used") // as a deferred `header -X-Tokens-Used` would
		}, false, 500, costReported},
		{"implicit 200", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "42")
			_, _ = w.Write([]byte("hi"))
		}, false, 42, costReported},
		{"announced trailer", func(w http.ResponseWriter) {
			w.Header().Set("Trailer", "X-Tokens-Used")
			w.WriteHeader(200)
			_, _ = w.Write([]byte("streamed"))
			w.Header().Set("X-Tokens-Used", "321")
		}, false, 321, costReported},
		{"announced trailer added after the header", streamedCost("0", "500"), false, 500, costReported},
		{"announced trailer replacing the header", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "0")
			streamedCost("", "")(w)
			w.Header().Set("X-Tokens-Used", "500")
		}, false, 500, costReported},
		{"prefixed trailer over the header", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "10")
			w.WriteHeader(200)
			w.Header().Set(http.TrailerPrefix+"X-Tokens-Used", "77")
		}, false, 77, costReported},
		{"invalid", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "lots")
			w.WriteHeader(200)
		}, false, 0, costNone},
		{"no response", func(http.ResponseWriter) {}, false, 0, costNone},
		{"announced trailer that never came", streamedCost("", ""), false, 0, costNone},
		{"header, then a trailer that never came", streamedCost("7", ""), false, 7, costReported},

		{"unfinished: header", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "500")
			w.WriteHeader(200)
		}, true, 500, costReported},
		{"unfinished: trailer that came", streamedCost("0", "500"), true, 500, costReported},
		{"unfinished: trailer that never came", streamedCost("", ""), true, 0, costUnfinished},
		{"unfinished: header, then a trailer that never came", streamedCost("7", ""), true, 7, costUnfinished},
		{"unfinished: nothing reported", func(w http.ResponseWriter) {
			w.WriteHeader(200)
			_, _ = w.Write([]byte("streamed"))
		}, true, 0, costUnfinished},
		{"unfinished: no response", func(http.ResponseWriter) {}, true, 0, costUnfinished},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := newCostRecorder(httptest.NewRecorder(), ds)
			c.handler(rec)
			rec.finish(c.unfinished)
			if got, st := rec.cost("X-Tokens-Used"); got != c.want || st != c.state {
				t.Errorf("cost = %d, %v; want %d, %v", got, st, c.want, c.state)
			}
		})
	}
}

// TestUnfinishedCost: a request whose response ended before it reported
// its cost pays the larger of its up-front cost, what the header reported
// meanwhile and the zone's abort charge; by default its up-front cost plus
// the burst (a zone's quota: plus its zone's burst).
func TestUnfinishedCost(t *testing.T) {
	rate, err := limiter.NewRule(limiter.RuleConfig{Name: "llm", Rate: 100, Per: time.Second, Burst: 500})
	if err != nil {
		t.Fatal(err)
	}
	quota, err := limiter.NewRule(limiter.RuleConfig{Name: "llm.quota", Algorithm: limiter.Quota, Rate: 100000, Period: limiter.Month})
	if err != nil {
		t.Fatal(err)
	}
	llm := &Zone{costHeader: "X-Tokens-Used"}
	capped := &Zone{costHeader: "X-Tokens-Used", costAbort: 300}
	llmQuota := &Zone{costHeader: "X-Tokens-Used", quotaOf: llm}
	decision := func(z *Zone, r *limiter.Rule, cost int64) zoneDecision {
		return zoneDecision{zone: z, req: limiter.Request{Rule: r, Cost: cost}}
	}
	for _, c := range []struct {
		name        string
		ds          []zoneDecision
		i           int
		provisional int64
		want        int64
	}{
		{"default", []zoneDecision{decision(llm, rate, 1)}, 0, 0, 501},
		{"default, cost 100", []zoneDecision{decision(llm, rate, 100)}, 0, 0, 600},
		{"default, a zone's quota", []zoneDecision{decision(llm, rate, 1), decision(llmQuota, quota, 1)}, 1, 0, 501},
		{"a quota alone", []zoneDecision{decision(llm, quota, 1)}, 0, 0, 100001},
		{"abort", []zoneDecision{decision(capped, rate, 1)}, 0, 0, 300},
		{"abort below the up-front cost", []zoneDecision{decision(capped, rate, 400)}, 0, 0, 400},
		{"abort below the header's", []zoneDecision{decision(capped, rate, 1)}, 0, 350, 350},
	} {
		if got := unfinishedCost(c.ds, c.i, c.provisional); got != c.want {
			t.Errorf("%s: unfinishedCost = %d, want %d", c.name, got, c.want)
		}
	}
}
