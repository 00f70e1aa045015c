package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// windowBanRule is a fixed window of one request a minute that bans a key
// for d after 2 denials within a minute. A window is what a deny cache
// holds no state of, so every denial reaches Redis and counts.
func windowBanRule(t testing.TB, name string, d time.Duration) *Rule {
	t.Helper()
	return mustConfig(t, RuleConfig{Name: name, Algorithm: FixedWindow, Rate: 1, Per: time.Minute,
		Ban: Ban{Duration: d, After: 2, Window: time.Minute}})
}

// banNode is one node of a test fleet: a store of its own on the shared
// Redis, and a limiter with a deny cache in front of it.
type banNode struct {
	store *RedisStore
	lim   *Limiter
}

func newBanNode(t *testing.T, opt RedisOptions) *banNode {
	t.Helper()
	s := newRedisStore(t, opt)
	return &banNode{store: s, lim: New(s, Options{Cache: NewDenyCache(DenyCacheOptions{})})}
}

// newBanNodes returns two nodes on the same Redis.
func newBanNodes(t *testing.T, opt RedisOptions) (a, b *banNode) {
	t.Helper()
	return newBanNode(t, opt), newBanNode(t, opt)
}

// banAcross bans key in r's zone (a windowBanRule) through node a, with
// three requests, and fails the test unless node b then answers it
// banned; it returns b's answer.
func banAcross(t *testing.T, a, b *banNode, r *Rule, key string) Result {
	t.Helper()
	for range 3 {
		a.decide(r, key)
	}
	res := b.decide(r, key)
	if !res.Banned {
		t.Fatalf("%s on node b: %+v, want banned", key, res)
	}
	return res
}

// waitForgotten waits until the node's deny cache is empty (a lift's
// message arrived).
func (n *banNode) waitForgotten(t *testing.T, what string) {
	t.Helper()
	waitFor(t, what, func() bool { return n.lim.Cache().Len() == 0 })
}

// decide decides one request of key in rule's zone on the node.
func (n *banNode) decide(r *Rule, key string) Result {
	res := make([]Result, 1)
	n.lim.Decide(context.Background(), []Request{{Rule: r, Key: key, Cost: 1}}, res)
	return res[0]
}

// waitFor polls cond every 20 ms, for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitBans polls the node's registry until it lists n bans of zones.
func (n *banNode) waitBans(t *testing.T, zones []string, want int) []BanRecord {
	t.Helper()
	var bans []BanRecord
	waitFor(t, fmt.Sprintf("%d bans listed", want), func() bool {
		var err error
		bans, err = n.lim.Bans(context.Background(), zones, 100)
		if err != nil {
			t.Fatalf("Bans: %v", err)
		}
		return len(bans) == want
	})
	return bans
}

// TestRedisBanRegistry: a ban that one node's denial started is listed by
// every node, with its start and end on Redis' clock, its denials and its
// time left; the list is kept in one sorted set per zone that expires after
// the bans, and a dry-run zone's would-be ban is not listed.
func TestRedisBanRegistry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := newBanNodes(t, RedisOptions{Address: srv.Addr, KeyPrefix: "reg:"})
	r := windowBanRule(t, "api", time.Hour)
	dry := mustConfig(t, RuleConfig{Name: "dry", Algorithm: FixedWindow, Rate: 1, Per: time.Minute, DryRun: true,
		Ban: Ban{Duration: time.Hour, After: 2, Window: time.Minute}})

	before := time.Now()
	var started Result
	for i := range 3 {
		started = a.decide(r, "k1")
		if i < 2 && started.Banned {
			t.Fatalf("request %d banned: %+v", i+1, started)
		}
		a.decide(dry, "k1")
	}
	if !started.BanStarted {
		t.Fatalf("the third request %+v, want the ban started", started)
	}
	bans := b.waitBans(t, []string{"api", "dry"}, 1)
	ban := bans[0]
	if ban.Zone != "api" || ban.Bucket != r.Bucket() || ban.Key != "k1" || ban.Denials != 2 ||
		ban.End.Sub(ban.Start) != time.Hour || ban.Left <= 59*time.Minute || ban.Left > time.Hour {
		t.Errorf("listed %+v, want k1's ban of an hour after 2 denials", ban)
	}
	if d := ban.Start.Sub(before); d < -time.Second || d > time.Minute {
		t.Errorf("the ban started at %s, %s after the test began: not Redis' time of now", ban.Start, d)
	}
	key := "reg:bans:{bans}:api"
	if ttl, _ := strconv.ParseInt(srv.MustDo("PTTL", key), 10, 64); ttl < (24*time.Hour+59*time.Minute).Milliseconds() || ttl > (25*time.Hour).Milliseconds() {
		t.Errorf("PTTL %s = %dms, want the ban's hour and a day", key, ttl)
	}
	if m := srv.MustDo("ZRANGE", key, "0", "-1"); !strings.HasSuffix(m, " 2 k1 api") {
		t.Errorf("the registry holds %q", m)
	}
	if got := srv.MustDo("EXISTS", "reg:bans:{bans}:dry"); got != "0" {
		t.Errorf("a dry-run zone's would-be ban is listed (EXISTS = %s)", got)
	}
}

// TestRedisUnbanAcrossNodes: a ban lifted on one node is lifted for the
// fleet: gone from Redis and the registry, dropped from the lifting node's
// deny cache at once and from the other node's as the channel's message
// arrives, so that the other node's next request is decided by its bucket
// again; meanwhile the other node answered the ban from its cache, without
// Redis.
func TestRedisUnbanAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := newBanNodes(t, RedisOptions{Address: srv.Addr, KeyPrefix: "lift:"})
	r := windowBanRule(t, "api", time.Hour)
	if res := banAcross(t, a, b, r, "k"); res.RetryAfter <= 59*time.Minute {
		t.Fatalf("node b: %+v, want banned for about an hour", res)
	}
	hits := b.lim.Cache().Hits()
	for range 10 {
		if res := b.decide(r, "k"); !res.Banned {
			t.Fatalf("node b: %+v, want banned", res)
		}
	}
	if got := b.lim.Cache().Hits() - hits; got != 10 {
		t.Errorf("node b answered %d of 10 banned requests from its deny cache, want all", got)
	}
	a.waitBans(t, []string{"api"}, 1)

	rec, lifted, err := a.lim.Unban(context.Background(), r, "k")
	if err != nil || !lifted {
		t.Fatalf("Unban: lifted %v, %v", lifted, err)
	}
	if rec.Key != "k" || rec.Zone != "api" || rec.Denials != 2 || rec.End.Sub(rec.Start) != time.Hour || rec.Left <= 59*time.Minute {
		t.Errorf("lifted %+v", rec)
	}
	if a.lim.Cache().Len() != 0 {
		t.Errorf("node a's cache still holds %d buckets", a.lim.Cache().Len())
	}
	bk := a.store.Key(r.Bucket(), "k")
	if got := srv.MustDo("EXISTS", bk+"!ban", bk+"!den"); got != "0" {
		t.Errorf("EXISTS ban and denials = %s, want both gone", got)
	}
	b.waitForgotten(t, "node b's cache forgets the ban")
	// The window still holds its one request: denied, not banned.
	if res := b.decide(r, "k"); res.Banned || res.Allowed {
		t.Errorf("node b after the unban: %+v, want a plain denial", res)
	}
	if bans, err := b.lim.Bans(context.Background(), []string{"api"}, 10); err != nil || len(bans) != 0 {
		t.Errorf("still listed: %v, %v", bansOf(bans), err)
	}
	if m := srv.MustDo("ZRANGE", "lift:bans:{bans}!lifted", "0", "-1"); m != "k api" {
		t.Errorf("lifted lately: %q, want \"k api\"", m)
	}
	if _, lifted, err := a.lim.Unban(context.Background(), r, "k"); lifted || err != nil {
		t.Errorf("a second Unban: lifted %v, %v; want nothing to lift", lifted, err)
	}
}

// TestRedisUnbanMissedMessage: a node whose subscription was down when a
// ban was lifted (its message missed) forgets the ban when it subscribes
// again, from the bans lifted lately.
func TestRedisUnbanMissedMessage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := newBanNodes(t, RedisOptions{Address: srv.Addr, KeyPrefix: "miss:"})
	r := windowBanRule(t, "api", time.Hour)
	banAcross(t, a, b, r, "k")
	// The lift as Unban makes it, less the message: as if b's
	// subscription had been down.
	ctx := context.Background()
	bk := a.store.Key(r.Bucket(), "k")
	srv.MustDo("DEL", bk+"!ban", bk+"!den")
	if err := a.store.unlist(ctx, "api", r.Bucket(), "k", "k "+r.Bucket(), true); err != nil {
		t.Fatal(err)
	}
	if b.lim.Cache().Len() == 0 {
		t.Fatal("node b forgot the ban without a message")
	}
	// Now b's subscription fails, and comes back.
	srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub")
	b.waitForgotten(t, "node b's cache forgets the ban after subscribing again")
	if res := b.decide(r, "k"); res.Banned {
		t.Errorf("node b: %+v, want no ban", res)
	}
	// And the channel works again.
	banAcross(t, a, b, r, "k2")
	if _, lifted, err := a.lim.Unban(ctx, r, "k2"); !lifted || err != nil {
		t.Fatalf("Unban k2: %v, %v", lifted, err)
	}
	b.waitForgotten(t, "node b's cache forgets k2's ban")
}

// TestRedisBansCluster: on a Redis Cluster the registry lists the bans of
// keys in every slot, and a lift reaches the other node's deny cache.
func TestRedisBansCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	opt := RedisOptions{Addresses: cl.Addrs(), KeyPrefix: "cl:"}
	a, b := newBanNodes(t, opt)
	r := windowBanRule(t, "api", time.Hour)
	keys := []string{"alpha", "bravo", "charlie", "delta", "echo"}
	for _, k := range keys {
		banAcross(t, a, b, r, k)
	}
	bans := b.waitBans(t, []string{"api"}, len(keys))
	for _, ban := range bans {
		if ban.Denials != 2 || ban.End.Sub(ban.Start) != time.Hour {
			t.Errorf("listed %+v", ban)
		}
	}
	for _, k := range keys {
		if _, lifted, err := a.lim.Unban(context.Background(), r, k); !lifted || err != nil {
			t.Fatalf("Unban %s: %v, %v", k, lifted, err)
		}
	}
	b.waitForgotten(t, "node b's cache forgets every ban")
	for _, k := range keys {
		if res := b.decide(r, k); res.Banned {
			t.Errorf("%s on node b after the unban: %+v", k, res)
		}
	}
	if bans, err := a.lim.Bans(context.Background(), []string{"api"}, 10); err != nil || len(bans) != 0 {
		t.Errorf("still listed: %v, %v", bansOf(bans), err)
	}
}

// banACL is the ACL line of docs/operations.md (as the Redis ACL tests
// have it), with the test's key prefix.
const banACL = "resetkeys ~acl:* resetchannels -@all +evalsha +eval +script|load +ping +hello +auth " +
	"+time +mget +set +del +pexpire +zadd +zrange +zrevrange +zremrangebyscore +zcard +zscore +zrem " +
	"+hincrby +expire +hgetall +zrangebyscore +get +zremrangebyrank +publish +subscribe &acl:bans"

// TestRedisBansACL: the registry, the lift and the channel need nothing
// beyond the documented ACL line, and log no refusal.
func TestRedisBansACL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.AddUser("bans", "bans-pw", strings.Fields(banACL)...)
	core, logs := observer.New(zap.WarnLevel)
	opt := RedisOptions{Address: srv.Addr, KeyPrefix: "acl:", Username: "bans", Password: "bans-pw", Log: zap.New(core)}
	a, b := newBanNodes(t, opt)
	r := windowBanRule(t, "api", time.Hour)
	banAcross(t, a, b, r, "k")
	b.waitBans(t, []string{"api"}, 1)
	if _, lifted, err := a.lim.Unban(context.Background(), r, "k"); !lifted || err != nil {
		t.Fatalf("Unban: %v, %v", lifted, err)
	}
	b.waitForgotten(t, "node b's cache forgets the ban")
	for _, e := range logs.All() {
		t.Errorf("logged: %s %v", e.Message, e.ContextMap())
	}
}

// TestRedisUnbanKeysStartingWithBang: a client key may start with "!", as
// the ban channel's other messages do: lifting the ban of a key named
// "!reset" (or "!ban", or any other) reaches the other node all the same.
// So does the lift of such a key in the form nodes from before the lift
// had a type of its own sent it, "<key> <bucket>".
func TestRedisUnbanKeysStartingWithBang(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := newBanNodes(t, RedisOptions{Address: srv.Addr, KeyPrefix: "bang:"})
	r := windowBanRule(t, "api", time.Hour)
	for _, key := range []string{"!reset", "!ban", "!charging", "!breaker-closed", "!lift", "!x", "x!"} {
		banAcross(t, a, b, r, key)
		if _, lifted, err := a.lim.Unban(context.Background(), r, key); !lifted || err != nil {
			t.Fatalf("Unban %s: %v, %v", key, lifted, err)
		}
		b.waitForgotten(t, "node b's cache forgets the ban of "+key)
		if res := b.decide(r, key); res.Banned {
			t.Errorf("%s on node b after the unban: %+v", key, res)
		}
	}
	// An older node's lift of "!reset": the ban as Unban lifts it, and
	// the message as that node sends it.
	banAcross(t, a, b, r, "!reset")
	bk := a.store.Key(r.Bucket(), "!reset")
	srv.MustDo("DEL", bk+"!ban", bk+"!den")
	srv.MustDo("PUBLISH", a.store.banChannel(), "!reset "+r.Bucket())
	b.waitForgotten(t, "node b's cache forgets the ban of !reset lifted by an older node")
	// A lift of "!reset" (in another zone) that node b missed: it catches up from the bans
	// lifted lately when it subscribes again.
	r2 := windowBanRule(t, "api2", time.Hour)
	banAcross(t, a, b, r2, "!reset")
	bk = a.store.Key(r2.Bucket(), "!reset")
	srv.MustDo("DEL", bk+"!ban", bk+"!den")
	if err := a.store.unlist(context.Background(), "api2", r2.Bucket(), "!reset", liftMsg("!reset", r2.Bucket()), true); err != nil {
		t.Fatal(err)
	}
	srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub")
	b.waitForgotten(t, "node b's cache forgets the missed lift of !reset after subscribing again")
}

// TestLiftMessages: the lift of every key a client can send reads back as
// itself, in this version's form and in the form of the nodes before it,
// and no other message of the ban channel reads as a lift.
func TestLiftMessages(t *testing.T) {
	t.Parallel()
	bucket := "api~log"
	for _, key := range []string{"k", "192.0.2.7", "!reset", "!ban", "!charging", "!breaker-closed", "!lift", "!", "!!",
		"x!", ClientKey("a b"), SourceKey(1, "!reset")} {
		for _, msg := range []string{liftMsg(key, bucket), key + " " + bucket} {
			if k, bk, ok := parseLift(msg); !ok || k != key || bk != bucket {
				t.Errorf("the lift %q reads as %q in %q (%v), want %q in %q", msg, k, bk, ok, key, bucket)
			}
		}
	}
	n := &banNote{start: 1, end: 2, key: "!reset", bucket: bucket}
	for _, msg := range []string{breakerClosedMsg, chargingMsg, banStartMsg(n), resetPrefix + "!reset " + bucket,
		resetPrefix + "k " + bucket + " other", "!future-type", "!future-type a b"} {
		if k, bk, ok := parseLift(msg); ok {
			t.Errorf("%q reads as the lift of %q in %q", msg, k, bk)
		}
	}
}
