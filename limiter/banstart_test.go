package limiter

import (
	"context"
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
