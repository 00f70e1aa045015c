package limiter

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestBanStartReachesEveryNode: a ban that starts through one node reaches
// every node's deny cache over the ban channel, so that a node that never
// asked Redis about the key still denies it while Redis is away (its local
// fallback would otherwise admit a banned key its share of the rate).
func TestBanStartReachesEveryNode(t *testing.T) {
	srv := redistest.Start(t)
	opt := RedisOptions{Address: srv.Addr, Timeout: 50 * time.Millisecond, MaxWait: 200 * time.Millisecond}
	newNode := func() *banNode {
		s := newRedisStore(t, opt)
		return &banNode{store: s, lim: New(s, Options{Cache: NewDenyCache(DenyCacheOptions{}), Local: newMemory(t, newTestClock(epoch))})}
	}
	a, b := newNode(), newNode()
	r := mustConfig(t, RuleConfig{Name: "login", Algorithm: FixedWindow, Rate: 1, Per: time.Minute, OnError: PolicyLocal,
		Ban: Ban{Duration: time.Hour, After: 2, Window: time.Minute}})
	for range 3 {
		a.decide(r, "mallory")
	}
	waitFor(t, "node b's deny cache to learn the ban", func() bool {
		return b.lim.Cache().banLeft(r, "mallory", b.lim.Cache().now()) > 0
	})
	srv.Pause()
	defer srv.Resume()
	res := make([]Result, 1)
	out := b.lim.Decide(context.Background(), []Request{{Rule: r, Key: "mallory", Cost: 1}}, res)
	if out != Denied || !res[0].Banned {
		t.Fatalf("node b, Redis paused, the banned key: %v %+v; want denied banned from its deny cache", out, res[0])
	}
}

// TestBanSurvivesReload: a configuration loaded after a ban started (a
// Caddy reload: a new limiter and deny cache on the same store) still
// answers the banned key while Redis is away. Its deny cache starts with
// the bans its store's other caches hold; empty, its local fallback
// admitted the banned key (the invariant checker's seed 320011: a node
// reloaded, then Redis paused, and it admitted 8 requests of a banned key).
func TestBanSurvivesReload(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: 50 * time.Millisecond, MaxWait: 200 * time.Millisecond})
	newConfig := func() *banNode {
		return &banNode{store: s, lim: New(s, Options{Cache: NewDenyCache(DenyCacheOptions{}), Local: newMemory(t, newTestClock(epoch))})}
	}
	r := mustConfig(t, RuleConfig{Name: "login", Algorithm: FixedWindow, Rate: 1, Per: time.Minute, OnError: PolicyLocal,
		Ban: Ban{Duration: time.Hour, After: 2, Window: time.Minute}})
	old := newConfig()
	for range 3 {
		old.decide(r, "mallory")
	}
	if old.lim.Cache().banLeft(r, "mallory", old.lim.Cache().now()) <= 0 {
		t.Fatal("the old configuration's deny cache did not learn the ban")
	}
	reloaded := newConfig()
	srv.Pause()
	defer srv.Resume()
	res := make([]Result, 1)
	out := reloaded.lim.Decide(context.Background(), []Request{{Rule: r, Key: "mallory", Cost: 1}}, res)
	if out != Denied || !res[0].Banned {
		t.Fatalf("reloaded configuration, Redis paused, the banned key: %v %+v; want denied banned from its deny cache", out, res[0])
	}
	if left := reloaded.lim.Cache().banLeft(r, "mallory", reloaded.lim.Cache().now()); left <= 0 || left > int64(time.Hour/time.Microsecond) {
		t.Errorf("the reloaded cache's ban has %dus left; want more than 0, at most the ban's hour", left)
	}
	runtime.KeepAlive(old) // the old configuration lives until the new one has provisioned
}
