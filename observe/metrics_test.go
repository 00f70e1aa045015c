package observe

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// gather returns the value of one series of a registry (and whether it is
// there): name, then label pairs.
func gather(t *testing.T, reg *prometheus.Registry, name string, labels ...string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metric
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

func TestZoneOutcome(t *testing.T) {
	t.Parallel()
	rule := func(p limiter.Policy) *limiter.Rule {
		r, err := limiter.NewRule(limiter.RuleConfig{Name: "z", Rate: 1, Per: time.Second, Burst: 1, OnError: p, FleetSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	allow, deny, local := rule(limiter.PolicyAllow), rule(limiter.PolicyDeny), rule(limiter.PolicyLocal)
	yes, no := &limiter.Result{Allowed: true}, &limiter.Result{}
	unknown := &limiter.Result{Allowed: true, Unknown: true}
	for _, c := range []struct {
		outcome limiter.Outcome
		rule    *limiter.Rule
		res     *limiter.Result
		want    limiter.Outcome
		ok      bool
	}{
		{limiter.Allowed, allow, yes, limiter.Allowed, true},
		{limiter.Denied, allow, no, limiter.Denied, true},
		{limiter.Denied, allow, yes, 0, false},     // another zone denied
		{limiter.Denied, allow, unknown, 0, false}, // a cached denial elsewhere
		{limiter.FailedOpen, allow, unknown, limiter.FailedOpen, true},
		{limiter.FailedClosed, deny, &limiter.Result{Unknown: true}, limiter.FailedClosed, true},
		{limiter.FailedClosed, allow, unknown, 0, false},
		{limiter.LocalAllowed, local, yes, limiter.LocalAllowed, true},
		{limiter.LocalAllowed, allow, unknown, limiter.FailedOpen, true},
		{limiter.LocalDenied, local, no, limiter.LocalDenied, true},
		{limiter.LocalDenied, local, yes, 0, false},
		{limiter.LocalDenied, allow, unknown, 0, false},
	} {
		got, ok := zoneOutcome(c.outcome, c.rule, c.res)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("zoneOutcome(%v, %v, %+v) = %v, %v; want %v, %v", c.outcome, c.rule.OnError(), *c.res, got, ok, c.want, c.ok)
		}
	}
}

// TestSeriesUsers: a store's series stay while any stats value uses them
// (a twin store of the same name, or the successor of a reload), and go
// with the last.
func TestSeriesUsers(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := registerMetrics(reg); err != nil {
		t.Fatalf("registering twice: %v", err)
	}
	const name = "redis:unit-twins:6379"
	a := claimStoreSeries(name)
	b := claimStoreSeries(name)
	a.errors[reasonTimeout].Inc()
	b.errors[reasonTimeout].Inc()
	releaseStoreSeries(name)
	if got, _ := gather(t, reg, "caddy_rate_limit_store_errors_total", "store", name, "reason", "timeout"); got != 2 {
		t.Fatalf("after one of two users left: %v, want 2", got)
	}
	releaseStoreSeries(name)
	if _, ok := gather(t, reg, "caddy_rate_limit_store_errors_total", "store", name); ok {
		t.Fatal("the series outlived their last user")
	}
}
