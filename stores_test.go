package fleetlimit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

func TestStoreNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		redis *RedisConfig
		want  string
	}{
		{nil, "memory"},
		{&RedisConfig{Address: "10.0.0.1:6379", Password: "secret"}, "redis:10.0.0.1:6379"},
		{&RedisConfig{Address: "10.0.0.1:6379", DB: 2}, "redis:10.0.0.1:6379/2"},
		{&RedisConfig{Addresses: []string{"a:1", "b:2"}}, "cluster:a:1,b:2"},
		{&RedisConfig{Address: "a:1", Cluster: true}, "cluster:a:1"},
		{&RedisConfig{SentinelMaster: "mymaster", SentinelAddresses: []string{"s:26379"}}, "sentinel:mymaster"},
	} {
		h := &Handler{Redis: c.redis}
		if got := h.storeName(); got != c.want || strings.Contains(got, "secret") {
			t.Errorf("storeName(%+v) = %q, want %q", c.redis, got, c.want)
		}
	}
}

// TestSweepIntervalAndMaxKeysReachTheStore: a handler's sweep_interval and
// max_keys set the process's memory store (sweep_interval used to be
// ignored): full buckets go within a few of its sweeps, and the key bound is
// the handler's.
func TestSweepIntervalAndMaxKeysReachTheStore(t *testing.T) {
	h := &Handler{
		SweepInterval: caddy.Duration(5 * time.Millisecond),
		MaxKeys:       6400,
		Zones:         []*Zone{{Name: "sweep_test", Rate: 1000, Per: caddy.Duration(time.Second)}},
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	store, ok := h.limiter.Store().(*limiter.MemoryStore)
	if !ok {
		t.Fatalf("store %T, want the memory store", h.limiter.Store())
	}
	if store.MaxKeys() != 6400 {
		t.Fatalf("MaxKeys() = %d, want the handler's 6400", store.MaxKeys())
	}
	rule := h.Zones[0].rule
	for i := range 10 {
		reqs := []limiter.Request{{Rule: rule, Key: "k" + strconv.Itoa(i), Cost: 1}}
		if ok, err := store.Decide(context.Background(), reqs, make([]limiter.Result, 1)); !ok || err != nil {
			t.Fatalf("request %d: %v %v", i, ok, err)
		}
	}
	// One token of 1000 per second is back within 1 ms: every bucket is
	// full again soon, and a sweep every 5 ms drops them.
	deadline := time.Now().Add(10 * time.Second)
	for store.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d full buckets left 10 s after sweeping every 5 ms", store.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFailedLoadKeepsMemorySettings: a configuration provisioned and then
// cleaned up because its load failed (Caddy cleans up the modules of a
// load that fails) leaves the memory store's max_keys and sweep interval
// to the configuration still running.
func TestFailedLoadKeepsMemorySettings(t *testing.T) {
	provision := func(maxKeys int) *Handler {
		h := &Handler{MaxKeys: maxKeys, Zones: []*Zone{{Name: "settings_test", Rate: 10, Per: caddy.Duration(time.Second)}}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return h
	}
	running := provision(6400)
	defer running.Cleanup()
	store := running.limiter.Store().(*limiter.MemoryStore)
	failed := provision(4096)
	if store.MaxKeys() != 4096 {
		t.Fatalf("while the new configuration loads: MaxKeys %d, want its 4096", store.MaxKeys())
	}
	failed.Cleanup() // its load failed
	if store.MaxKeys() != 6400 {
		t.Fatalf("after a failed load: MaxKeys %d, want the running configuration's 6400", store.MaxKeys())
	}
}

// TestMemoryBoundClaimsInEitherOrder: the memory store's key bound is the
// smallest max_keys any handler using it wrote, whatever order the
// handlers were provisioned in (Caddy provisions servers in no fixed
// order); a handler without max_keys (a site that only falls back to the
// store, a Redis zone with on_error local) never raises it. The default
// holds only when no handler wrote one, and a bound comes back when the
// handler that set a smaller one is cleaned up.
func TestMemoryBoundClaimsInEitherOrder(t *testing.T) {
	t.Parallel()
	explicit, larger, unset := &Handler{}, &Handler{}, &Handler{}
	claims := map[*Handler]memoryClaim{
		explicit: {owner: explicit, maxKeys: 20000, sweep: time.Minute},
		larger:   {owner: larger, maxKeys: 900000, sweep: time.Minute},
		unset:    {owner: unset, sweep: time.Minute},
	}
	for _, c := range []struct {
		name  string
		order []*Handler
		want  int
	}{
		{"explicit then unset", []*Handler{explicit, unset}, 20000},
		{"unset then explicit", []*Handler{unset, explicit}, 20000},
		{"smaller then larger", []*Handler{explicit, larger}, 20000},
		{"larger then smaller", []*Handler{larger, explicit}, 20000},
		{"larger then unset", []*Handler{larger, unset}, 900000},
		{"unset then larger", []*Handler{unset, larger}, 900000},
		{"unset alone", []*Handler{unset}, DefaultMaxKeys},
	} {
		s := limiter.NewMemoryStore(limiter.MemoryOptions{})
		m := &memorySettings{}
		for _, h := range c.order {
			m.claim(s, claims[h])
		}
		if got := s.MaxKeys(); got != c.want {
			t.Errorf("%s: MaxKeys %d, want %d", c.name, got, c.want)
		}
		s.Close()
	}

	s := limiter.NewMemoryStore(limiter.MemoryOptions{})
	defer s.Close()
	m := &memorySettings{}
	m.claim(s, claims[larger])
	m.claim(s, claims[explicit])
	m.claim(s, claims[unset])
	m.release(s, explicit)
	if got := s.MaxKeys(); got != 900000 {
		t.Errorf("the smaller bound's handler cleaned up: MaxKeys %d, want the other explicit bound 900000", got)
	}
	m.release(s, larger)
	if got := s.MaxKeys(); got != DefaultMaxKeys {
		t.Errorf("only a handler without max_keys left: MaxKeys %d, want the default %d", got, DefaultMaxKeys)
	}
}

// TestMemoryBoundOfTwoSites provisions two handlers sharing the process's
// memory store, as two sites of one Caddyfile, in both orders: one on the
// memory store with max_keys 20000, one on Redis whose zone falls back to
// local buckets (on_error local, the default) without max_keys. The
// written bound holds in both orders.
func TestMemoryBoundOfTwoSites(t *testing.T) {
	srv := redistest.Start(t)
	bounded := func() *Handler {
		return &Handler{MaxKeys: 20000, Zones: []*Zone{{Name: "bounded_site", Rate: 10, Per: caddy.Duration(time.Second)}}}
	}
	idle := func() *Handler {
		return &Handler{Redis: &RedisConfig{Address: srv.Addr}, Zones: []*Zone{{Name: "idle_site", Rate: 10, Per: caddy.Duration(time.Second)}}}
	}
	for _, order := range []string{"memory site first", "redis site first"} {
		hs := []*Handler{bounded(), idle()}
		if order == "redis site first" {
			hs[0], hs[1] = hs[1], hs[0]
		}
		for _, h := range hs {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			if err := h.Provision(ctx); err != nil {
				cancel()
				t.Fatalf("%s: %v", order, err)
			}
			t.Cleanup(cancel)
		}
		if hs[1].memory == nil || hs[0].memory == nil {
			t.Fatalf("%s: both handlers should use the memory store (one for its buckets, one for its local fallback)", order)
		}
		if got := hs[0].memory.MaxKeys(); got != 20000 {
			t.Errorf("%s: the process's memory store holds at most %d keys, want the max_keys 20000 written on the memory site", order, got)
		}
		for _, h := range hs {
			if err := h.Cleanup(); err != nil {
				t.Errorf("%s: cleanup: %v", order, err)
			}
		}
	}
}
