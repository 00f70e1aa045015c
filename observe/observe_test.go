package observe

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// testStore is a memory store of its own, under a pool key and name of its
// own, as a handler would pass it to New.
type testStore struct {
	key, name string
	store     *limiter.MemoryStore
}

func newTestStore(t *testing.T, key string) testStore {
	t.Helper()
	return testStore{key: key, name: key, store: limiter.NewMemoryStore(limiter.MemoryOptions{Sweep: time.Minute})}
}

// provision makes a handler's share of the observability, as its Provision
// does, with one zone of the given rate per second on store s.
func provision(t *testing.T, zone string, rate int64, s testStore) *Handler {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	rule, err := limiter.NewRule(limiter.RuleConfig{Name: zone, Rate: rate, Per: time.Second, Burst: rate})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(ctx, Config{Rules: []*limiter.Rule{rule}, Store: s.store, StoreKey: s.key, StoreName: s.name, Memory: s.store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// zoneEntries returns the stats document's entries of a zone name.
func zoneEntries(name string) []statsZone {
	var out []statsZone
	for _, z := range collectStats(context.Background(), time.Now(), 0, nil).Zones {
		if z.Name == name {
			out = append(out, z)
		}
	}
	return out
}

// wantZone checks that the document has one entry of the zone name, with
// this rate and store.
func wantZone(t *testing.T, when, name string, rate int64, store string) {
	t.Helper()
	zs := zoneEntries(name)
	if len(zs) != 1 || zs[0].Rate != rate || zs[0].Store != store {
		t.Fatalf("%s: entries of zone %s: %+v, want one with rate %d on store %s", when, name, zs, rate, store)
	}
}

// TestFailedReloadKeepsStats: a configuration whose load fails after its
// handlers provisioned (a later module errors) never runs: Caddy cleans up
// its handlers and keeps the old configuration, and the stats describe
// the old one again. A successful reload shows the new one.
func TestFailedReloadKeepsStats(t *testing.T) {
	t.Parallel()
	const zone = "unit_failed_reload"
	storeA := newTestStore(t, "unit_failed_reload-a")
	storeB := newTestStore(t, "unit_failed_reload-b")

	a := provision(t, zone, 10, storeA)
	wantZone(t, "config A", zone, 10, storeA.name)

	// Config B: zone api at rate 20 on A's store, and at rate 30 on
	// another store; then a later module fails, and Caddy cleans up what
	// B provisioned.
	b1 := provision(t, zone, 20, storeA)
	b2 := provision(t, zone, 30, storeB)
	if err := b1.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := b2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	wantZone(t, "after the failed load of B", zone, 10, storeA.name)
	if a.zones[0].stats.info.Load().rate != 10 {
		t.Fatal("A's zone lost its description")
	}

	// Config C loads: it shows while A still runs beside it, and alone
	// once A is cleaned up; the counts go on.
	a.zones[0].stats.count(limiter.Allowed, time.Now().Unix())
	c := provision(t, zone, 40, storeA)
	wantZone(t, "while C provisions", zone, 40, storeA.name)
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	wantZone(t, "after the reload to C", zone, 40, storeA.name)
	if z := zoneEntries(zone)[0]; z.Totals.Allowed != 1 {
		t.Errorf("the reload lost the counts: %+v", z.Totals)
	}
	if err := c.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if zs := zoneEntries(zone); len(zs) != 0 {
		t.Errorf("the zone outlived its last handler: %+v", zs)
	}
}

// TestZoneOnTwoStores: zones of one name on two stores have buckets of
// their own, and are two entries of the stats, each with its own rule and
// store; their metric series are one, summed by zone name.
func TestZoneOnTwoStores(t *testing.T) {
	t.Parallel()
	const zone = "unit_two_stores"
	mem := newTestStore(t, "unit_two_stores-memory")
	other := newTestStore(t, "unit_two_stores-other")
	h1 := provision(t, zone, 10, mem)
	h2 := provision(t, zone, 20, other)
	sec := time.Now().Unix()
	h1.zones[0].stats.count(limiter.Allowed, sec)
	h2.zones[0].stats.count(limiter.Denied, sec)
	h2.zones[0].stats.count(limiter.Denied, sec)

	zs := zoneEntries(zone)
	if len(zs) != 2 {
		t.Fatalf("entries of zone %s: %+v, want one per store", zone, zs)
	}
	got := map[string]statsZone{}
	for _, z := range zs {
		got[z.Store] = z
	}
	if z := got[mem.name]; z.Rate != 10 || z.Totals.Allowed != 1 || z.Totals.Denied != 0 {
		t.Errorf("zone on %s: %+v, want rate 10, 1 allowed", mem.name, z)
	}
	if z := got[other.name]; z.Rate != 20 || z.Totals.Allowed != 0 || z.Totals.Denied != 2 {
		t.Errorf("zone on %s: %+v, want rate 20, 2 denied", other.name, z)
	}

	// One series per zone name, and a registry that gathers (no series
	// sent twice).
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	var evictionSeries int
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "zone" && l.GetValue() == zone && f.GetName() == "caddy_rate_limit_evictions_total" {
					evictionSeries++
				}
			}
		}
	}
	if evictionSeries != 1 {
		t.Errorf("%d evictions series of zone %s, want 1", evictionSeries, zone)
	}

	// One store's handler leaves: its entry goes, the other stays.
	if err := h2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	wantZone(t, "after the second store's handler left", zone, 10, mem.name)
}
