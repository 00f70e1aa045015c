package limiter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestAbandonedChargesRefunded stalls Redis (DEBUG SLEEP 0.3) under a
// concurrency zone of limit 4 whose requests give up after the store's
// timeout and take the local fallback: the charges Redis makes when it
// runs their abandoned batches late are refunded by the pipeline
// worker, so that within a second of the stall's end no slot is held in
// Redis that no request holds (they used to stay for the whole lease).
// The Cluster path is checked the same way, with a request of two zones
// on two slots.
func TestAbandonedChargesRefunded(t *testing.T) {
	t.Parallel()
	t.Run("single", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--enable-debug-command", "yes")
		rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 25 * time.Millisecond})
		checkAbandoned(t, rs, func() { srv.MustDo("DEBUG", "SLEEP", "0.3") }, func(key string) string { return srv.MustDo("ZCARD", key) })
	})
	t.Run("client kill", func(t *testing.T) {
		// Redis runs the batches waiting behind a DEBUG SLEEP, then the
		// CLIENT KILL queued behind them closes their connections before
		// their replies are read: the replies are lost, and the slots
		// they took are refunded all the same.
		t.Parallel()
		srv := redistest.Start(t, "--enable-debug-command", "yes")
		rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 25 * time.Millisecond})
		kill := func() {
			var wg sync.WaitGroup
			wg.Go(func() { _, _ = srv.Do("DEBUG", "SLEEP", "0.3") })
			time.Sleep(150 * time.Millisecond)
			wg.Go(func() { _, _ = srv.Do("CLIENT", "KILL", "TYPE", "normal") })
			wg.Wait()
		}
		checkAbandoned(t, rs, kill, func(key string) string { n, _ := srv.Do("ZCARD", key); return n })
		if rs.slotRefundsSent.Load() == 0 {
			t.Log("no reply was lost this time: the kill came between batches")
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t, 3, "--enable-debug-command", "yes")
		rs := newRedisStore(t, RedisOptions{Address: c.Addrs()[0], Addresses: c.Addrs()[1:], Cluster: true, Timeout: 25 * time.Millisecond})
		stall := func() {
			var wg sync.WaitGroup
			for _, m := range c.Nodes() {
				wg.Go(func() { m.MustDo("DEBUG", "SLEEP", "0.3") })
			}
			wg.Wait()
		}
		checkAbandoned(t, rs, stall, func(key string) string {
			for _, m := range c.Nodes() {
				if n, err := m.Do("ZCARD", key); err == nil && n != "0" {
					return n
				}
			}
			return "0"
		})
	})
}

// checkAbandoned loads a limiter on rs with requests of two concurrency
// zones (on different Cluster slots) while stall runs, then waits for
// every slot key to count 0 held slots (held returns one key's count).
func checkAbandoned(t *testing.T, rs *RedisStore, stall func(), held func(key string) string) {
	t.Helper()
	rules := []*Rule{
		mustConfig(t, RuleConfig{Name: "cc", Algorithm: Concurrency, Rate: 4, Lease: time.Minute}),
		mustConfig(t, RuleConfig{Name: "cc2", Algorithm: Concurrency, Rate: 4, Lease: time.Minute}),
	}
	l := New(rs, Options{Local: NewMemoryStore(MemoryOptions{})})
	const key = "k"
	stop := make(chan struct{})
	var wg sync.WaitGroup
	counts := make([]map[Outcome]int, 8)
	for g := range counts {
		counts[g] = map[Outcome]int{}
		wg.Go(func() {
			for n := 0; n < 5000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				reqs := []Request{{Rule: rules[0], Key: key, Cost: 1}, {Rule: rules[1], Key: key + "x", Cost: 1}}
				res := make([]Result, 2)
				out := l.Decide(context.Background(), reqs, res)
				counts[g][out]++
				if out == Allowed || out == LocalAllowed {
					time.Sleep(2 * time.Millisecond)
					_ = l.Refund(context.Background(), out, reqs, res)
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	stall()
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	ended := time.Now()
	total := map[Outcome]int{}
	for _, c := range counts {
		for o, n := range c {
			total[o] += n
		}
	}
	t.Logf("outcomes: %v", total)
	if total[LocalAllowed]+total[LocalDenied] == 0 {
		t.Fatalf("no decision took the fallback during the stall: %v", total)
	}
	for _, r := range rules {
		k := rs.Key(r.Bucket(), key)
		if r.Name() == "cc2" {
			k = rs.Key(r.Bucket(), key+"x")
		}
		for {
			n := held(k)
			if n == "0" {
				break
			}
			if time.Since(ended) > time.Second {
				t.Fatalf("%s: %s slots held in Redis a second after the last request ended, want 0 (abandoned charges kept; %d refunded, %d slot refunds)",
					r.Name(), n, rs.AbandonedRefunded(), rs.slotRefundsSent.Load())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
