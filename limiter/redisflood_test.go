package limiter

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// floodRedis sends n decisions with new keys of rule r to s from 32
// goroutines, checking the hot key every 1,000 of them; it returns the
// store errors by text, and how many times the hot key was admitted.
func floodRedis(t *testing.T, s *RedisStore, r *Rule, n int) (errs map[string]int, hotAdmitted int64) {
	t.Helper()
	var next, hot atomic.Int64
	var mu sync.Mutex
	errs = map[string]int{}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			res := make([]Result, 1)
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				key := "flood-" + strconv.FormatInt(i, 10)
				if i%1000 == 0 {
					key = "hot"
				}
				ok, err := s.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, res)
				switch {
				case err != nil:
					mu.Lock()
					errs[err.Error()]++
					mu.Unlock()
				case ok && key == "hot":
					hot.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return errs, hot.Load()
}

// TestRedisKeyFloodVolatileTTL floods a Redis of maxmemory 8mb under
// maxmemory-policy volatile-ttl with 120,000 new keys of a zone of 100 per
// 24h (each bucket then lives 864 s; about 16 MB of buckets): Redis evicts
// the buckets closest to full, no decision fails, and a drained hot key
// (24 h from full) stays exact throughout.
func TestRedisKeyFloodVolatileTTL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "volatile-ttl")
	s := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 5 * time.Second})
	r := mustRule(t, "flood", 100, 24*time.Hour, 100)
	for i := range 100 {
		if ok, _ := decideOne(t, s, r, "hot", 1); !ok {
			t.Fatalf("hot key request %d denied within its burst", i)
		}
	}
	const n = 120_000
	errs, hot := floodRedis(t, s, r, n)
	if len(errs) > 0 {
		t.Fatalf("store errors under volatile-ttl: %v", errs)
	}
	if hot != 0 {
		t.Fatalf("the drained hot key was admitted %d times during the flood: its bucket was lost", hot)
	}
	m, err := ReadRedisMemory(context.Background(), s.Client())
	if err != nil {
		t.Fatal(err)
	}
	if m.EvictedKeys == 0 {
		t.Fatalf("%d keys in 8mb and nothing evicted: %+v", n, m)
	}
	t.Logf("%d new keys: %d evicted, used_memory %.1f MB of %.1f MB; hot key admitted 0 times after its burst",
		n, m.EvictedKeys, float64(m.UsedMemory)/1e6, float64(m.MaxMemory)/1e6)
}

// TestRedisKeyFloodNoEviction floods a Redis of maxmemory 8mb under
// noeviction with 120,000 new keys: the store warns at start that the policy lets buckets fill
// Redis, and once full the script calls fail with OOM, which IsOOM tells
// apart.
func TestRedisKeyFloodNoEviction(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
	core, logs := observer.New(zap.InfoLevel)
	s := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 5 * time.Second, Log: zap.New(core), BreakerFailures: 1 << 30})
	deadline := time.Now().Add(10 * time.Second)
	for len(logs.FilterMessageSnippet("volatile-ttl").All()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no warning naming volatile-ttl; logs: %v", logs.All())
		}
		time.Sleep(10 * time.Millisecond)
	}
	warn := logs.FilterMessageSnippet("volatile-ttl").All()[0]
	if !strings.Contains(warn.Message+" "+warn.ContextMap()["maxmemory_policy"].(string), "noeviction") {
		t.Fatalf("the warning does not name the policy: %q %v", warn.Message, warn.ContextMap())
	}
	r := mustRule(t, "flood", 100, 24*time.Hour, 100)
	const n = 120_000
	errs, _ := floodRedis(t, s, r, n)
	oom := 0
	for msg, c := range errs {
		if IsOOM(errString(msg)) {
			oom += c
		}
	}
	if oom == 0 {
		t.Fatalf("%d keys in 8mb under noeviction and no OOM error: %v", n, errs)
	}
	t.Logf("OOM errors: %d", oom)
}

// errString is an error with the given text.
type errString string

func (e errString) Error() string { return string(e) }
