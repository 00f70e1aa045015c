package fleetlimit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

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
