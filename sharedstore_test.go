package fleetlimit

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestSharedStore: another module (the Envoy rate limit service) that asks
// for the store of a redis configuration gets the very store of the
// handlers with that configuration, and without one the process's memory
// store; the store outlives its users until the last one releases it.
func TestSharedStore(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
	for _, redis := range []*RedisConfig{nil, {Address: addr}} {
		h := &Handler{Redis: redis, Zones: []*Zone{{Name: "shared_test", Rate: 10, Per: caddy.Duration(time.Second)}}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		var same *RedisConfig
		if redis != nil {
			same = &RedisConfig{Address: addr}
		}
		s, err := ProvisionStore(same, StoreOptions{Local: true})
		if err != nil {
			t.Fatal(err)
		}
		if s.Store != h.limiter.Store() {
			t.Fatalf("redis %v: the shared store is not the handler's", redis)
		}
		if redis != nil && s.Local == nil {
			t.Fatal("no memory store for local fallback buckets")
		}
		// The handler goes (a reload that drops it): the store stays.
		_ = h.Cleanup()
		cancel()
		again, err := ProvisionStore(same, StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if again.Store != s.Store {
			t.Fatalf("redis %v: the store changed while a user held it", redis)
		}
		_ = again.Release()
		_ = s.Release()
		_ = s.Release() // harmless
		if _, ok := stores.References(poolKeyOf(t, same)); ok {
			t.Fatalf("redis %v: the store is still pooled after its last user released it", redis)
		}
	}
	if _, err := ProvisionStore(&RedisConfig{}, StoreOptions{}); err == nil {
		t.Fatal("a redis configuration without an address was accepted")
	}
}

// poolKeyOf returns the pool key of a redis configuration's store.
func poolKeyOf(t *testing.T, redis *RedisConfig) string {
	if redis == nil {
		return memoryPoolKey
	}
	opt, err := redis.options()
	if err != nil {
		t.Fatal(err)
	}
	return opt.poolKey()
}

// TestProvisionStoreWaitsForRedis: a store provisioned while its Redis
// answers late (paused for 600ms: a node starting on a loaded machine) is
// handed over connected, its scripts loaded, so that the first decision of
// a caller whose deadline is shorter than the timeout (the Envoy rate
// limit service's callers give 20ms) is decided by Redis, not by the
// failure policy. Provisioning the same configuration again (a reload)
// takes the connected store at once.
func TestProvisionStoreWaitsForRedis(t *testing.T) {
	srv := redistest.Start(t)
	srv.Pause()
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		time.Sleep(600 * time.Millisecond)
		srv.Resume()
	}()
	t.Cleanup(func() { <-resumed })
	cfg := &RedisConfig{Address: srv.Addr, Timeout: caddy.Duration(time.Second)}
	s, err := ProvisionStore(cfg, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Release() })
	r, err := limiter.NewRule(limiter.RuleConfig{Name: "provision_wait_test", Rate: 10, Per: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond) // below the pause and the timeout
	defer cancel()
	ok, err := s.Store.Decide(ctx, []limiter.Request{{Rule: r, Key: "first", Cost: 1}}, make([]limiter.Result, 1))
	if err != nil || !ok {
		t.Fatalf("the first decision on a store provisioned while Redis answered late: %v %v; want it admitted by Redis", ok, err)
	}
	srv.Pause()
	defer srv.Resume()
	began := time.Now()
	again, err := ProvisionStore(&RedisConfig{Address: srv.Addr, Timeout: caddy.Duration(time.Second)}, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release()
	if took := time.Since(began); again.Store != s.Store || took > 500*time.Millisecond {
		t.Fatalf("provisioning the configuration again, Redis paused: the same store %v, after %s; want the same store at once",
			again.Store == s.Store, took)
	}
}
