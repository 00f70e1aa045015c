package limiter

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// Bans reach every node as they start. The registry's writer publishes
// each ban it lists on the store's ban channel, and every node's deny
// caches learn it: a node that never asked Redis about the key still
// denies it, from its cache, while Redis is away and its zones decide on
// their local buckets. The message carries the ban's end by Redis' clock;
// a node holds it until then by its own clock (the two differ by the
// clock offset the stats report, milliseconds).

//
// The registry's writer lists bans a little after they start, so a ban
// lifted at once may be lifted before its start is published: a node
// remembers the lifts it heard of lately, and ignores the start of a ban
// lifted since.

// banStartPrefix starts a ban start's message: "!ban <start> <end> <key>
// <bucket>" (times in unix microseconds). Keys hold no space (ClientKey);
// a key may start with "!", but its place in the message tells it apart.
const banStartPrefix = "!ban "

// recentLiftsMax bounds the lifts a node remembers, and recentLiftsKeep
// how long.
const (
	recentLiftsMax  = 4096
	recentLiftsKeep = time.Minute
)

// banStartMsg returns the ban channel's message of a ban that started.
func banStartMsg(n *banNote) string {
	return banStartPrefix + strconv.FormatInt(n.start, 10) + " " + strconv.FormatInt(n.end, 10) + " " + n.key + " " + n.bucket
}

// started makes the deny caches learn a ban that started on a node (this
// one too: learning twice is harmless), from its message, unless it was
// lifted since.
func (b *redisBans) started(msg string) {
	f := strings.SplitN(strings.TrimPrefix(msg, banStartPrefix), " ", 4)
	if len(f) != 4 || f[2] == "" || f[3] == "" {
		return
	}
	start, err1 := strconv.ParseInt(f[0], 10, 64)
	end, err2 := strconv.ParseInt(f[1], 10, 64)
	key, bucket := f[2], f[3]
	if err1 != nil || err2 != nil {
		return
	}
	now := time.Now().UnixMicro()
	left := end - now
	if left <= 0 || b.liftedSince(key, bucket, start) {
		return
	}
	for _, c := range b.caches.live() {
		c.learnBanIn(bucket, key, c.now()+left)
	}
}

// recentLifts are the lifts a node heard of lately: when, by key and
// bucket.
type recentLifts struct {
	mu sync.Mutex
	m  map[string]int64 // "<key> <bucket>": unix microseconds
}

// heard records the lift of key's ban in bucket, heard of now.
func (r *recentLifts) heard(key, bucket string, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]int64)
	}
	for k, at := range r.m {
		if len(r.m) < recentLiftsMax && at > now-recentLiftsKeep.Microseconds() {
			break
		}
		delete(r.m, k)
	}
	r.m[key+" "+bucket] = now
}

// liftedSince reports whether the key's ban in bucket was lifted at or
// after start, as far as this node heard.
func (b *redisBans) liftedSince(key, bucket string, start int64) bool {
	b.lifts.mu.Lock()
	defer b.lifts.mu.Unlock()
	at, ok := b.lifts.m[key+" "+bucket]
	return ok && at >= start
}
