package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Bans in the Redis store: the registry the fleet lists, a ban's start and
// lift as the fleet hears of them.

const (
	// banQueueSize is how many started bans wait for the writer at most.
	banQueueSize = 1024
	// banBatch is how many bans the writer sends in one round trip at most.
	banBatch = 256
	// banTimeout bounds one round trip of the registry (a write, a list,
	// an unban's steps).
	banTimeout = 2 * time.Second
	// banRetention is how long a zone's list outlives the end of the last
	// ban written to it: a zone that left the configuration leaves nothing
	// behind.
	banRetention = 24 * time.Hour
	// banWarnEvery is how often a failing write is logged at most.
	banWarnEvery = time.Minute
	// banReadSlack is how long after its end, by this node's clock, a
	// ban is pruned by a read: reads filter by Redis' time, and this
	// node's clock may be a little ahead of it.
	banReadSlack = time.Minute
)

// redisBans is a RedisStore's ban registry and ban channel.
type redisBans struct {
	s *RedisStore
	// ctx ends when the store closes: the writes and the subscriber's
	// dials give up then.
	ctx    context.Context
	queue  chan banNote
	caches cacheSet
	// dropped counts the bans the full queue left out of the registry.
	dropped atomic.Uint64
	// lastWarn is when the registry or the channel last logged a failure
	// (unix nanoseconds).
	lastWarn atomic.Int64
	// listen is the channel's subscriber.
	listen banListener
	// lifts are the lifts heard of lately (liftedSince).
	lifts recentLifts
}

// startRedisBans starts the store's ban registry writer and the subscriber
// of its ban channel; both stop with the store.
func startRedisBans(s *RedisStore) *redisBans {
	ctx, cancel := context.WithCancel(context.Background())
	b := &redisBans{s: s, ctx: ctx, queue: make(chan banNote, banQueueSize)}
	s.wg.Go(func() {
		<-s.stop
		cancel()
	})
	s.wg.Go(b.write)
	s.wg.Go(func() { b.listen.run(b) })
	return b
}

// banListKey returns the Redis key of a zone's ban registry.
func (s *RedisStore) banListKey(zone string) string { return s.prefix + "bans:{bans}:" + zone }

// recordBan implements banRecorder: it queues the ban for the writer, or
// drops it when the queue is full.
func (s *RedisStore) recordBan(n banNote) {
	select {
	case s.bans.queue <- n:
	default:
		s.bans.dropped.Add(1)
	}
}

// denyCaches implements cacheHolder.
func (s *RedisStore) denyCaches() *cacheSet { return &s.bans.caches }

// BansDropped returns how many started bans the registry left out because
// its writer's queue was full.
func (s *RedisStore) BansDropped() uint64 { return s.bans.dropped.Load() }

// write sends the queued bans, as they come, until the store closes.
func (b *redisBans) write() {
	batch := make([]banNote, 0, banBatch)
	var dropped uint64
	for {
		select {
		case <-b.ctx.Done():
			return
		case n := <-b.queue:
			batch = append(batch[:0], n)
		}
	more:
		for len(batch) < banBatch {
			select {
			case n := <-b.queue:
				batch = append(batch, n)
			default:
				break more
			}
		}
		if err := b.send(batch); err != nil {
			b.warn("rate limit ban registry: a ban could not be listed (it holds all the same)", err)
		}
		if d := b.dropped.Load(); d != dropped {
			dropped = d
			b.warn("rate limit ban registry: bans started faster than they could be listed; some are not listed (they hold all the same)", nil)
		}
		clear(batch)
	}
}

// send writes bans to their zones' lists in one round trip, pruning each
// list of the bans that ended (by the bans' own start: Redis' time) and
// keeping the MaxBanRecords that end last.
func (b *redisBans) send(batch []banNote) error {
	ctx, cancel := context.WithTimeout(b.ctx, banTimeout)
	defer cancel()
	type zoneTimes struct{ now, end int64 }
	zones := make(map[string]zoneTimes, 1)
	pipe := b.s.client.Pipeline()
	for i := range batch {
		n := &batch[i]
		key := b.s.banListKey(n.zone)
		pipe.ZAdd(ctx, key, redis.Z{Score: float64(n.end), Member: banMember(n)})
		t := zones[key]
		zones[key] = zoneTimes{now: max(t.now, n.start), end: max(t.end, n.end)}
	}
	for i := range batch {
		// Every node's deny caches learn the ban as it starts: a node
		// that never asked about the key denies it from its cache even
		// while Redis is away (started).
		pipe.Publish(ctx, b.s.banChannel(), banStartMsg(&batch[i]))
	}
	for key, t := range zones {
		pipe.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(t.now, 10))
		pipe.ZRemRangeByRank(ctx, key, 0, -MaxBanRecords-1)
		pipe.PExpire(ctx, key, us(t.end-t.now)+banRetention)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// banMember encodes a ban as its list's member. The key holds no space
// (ClientKey): the bucket's name is the rest.
func banMember(n *banNote) string {
	var buf [64]byte
	b := strconv.AppendInt(buf[:0], n.start, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, n.denials, 10)
	b = append(b, ' ')
	b = append(b, n.key...)
	b = append(b, ' ')
	b = append(b, n.bucket...)
	return string(b)
}

// parseBanMember decodes a list's member of a zone's ban ending at end.
func parseBanMember(zone, m string, end int64) (banNote, bool) {
	start, rest, ok1 := strings.Cut(m, " ")
	denials, rest, ok2 := strings.Cut(rest, " ")
	key, bucket, ok3 := strings.Cut(rest, " ")
	st, err1 := strconv.ParseInt(start, 10, 64)
	dn, err2 := strconv.ParseInt(denials, 10, 64)
	if !ok1 || !ok2 || !ok3 || err1 != nil || err2 != nil || key == "" || bucket == "" {
		return banNote{}, false
	}
	return banNote{zone: zone, bucket: bucket, key: key, start: st, end: end, denials: dn}, true
}

// Bans implements BanKeeper: the fleet's bans in force in the zones named,
// from the registry, at most limit per zone, those that end last first;
// their time left is by Redis' clock.
func (s *RedisStore) Bans(ctx context.Context, zones []string, limit int) ([]BanRecord, error) {
	if len(zones) == 0 || limit <= 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, banTimeout)
	defer cancel()
	old := strconv.FormatInt(time.Now().Add(-banReadSlack).UnixMicro(), 10)
	pipe := s.client.Pipeline()
	clock := pipe.Time(ctx)
	reads := make([]*redis.ZSliceCmd, len(zones))
	for i, z := range zones {
		key := s.banListKey(z)
		pipe.ZRemRangeByScore(ctx, key, "-inf", old)
		reads[i] = pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
			Key: key, Start: "+inf", Stop: "(" + old, ByScore: true, Rev: true, Count: int64(limit),
		})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, banError(err)
	}
	now := clock.Val().UnixMicro()
	var out []BanRecord
	seen := make(map[string]bool, len(zones))
	for i, z := range zones {
		if seen[z] {
			continue // a zone named twice is listed once
		}
		seen[z] = true
		for _, e := range reads[i].Val() {
			m, _ := e.Member.(string)
			n, ok := parseBanMember(z, m, int64(e.Score))
			if ok && n.end > now {
				out = append(out, n.record(now))
			}
		}
	}
	sortBans(out)
	return out, nil
}

// sortBans orders bans by their end, latest first.
func sortBans(bans []BanRecord) {
	slices.SortStableFunc(bans, func(a, b BanRecord) int { return b.End.Compare(a.End) })
}

// warn logs a failure of the registry or the channel, at most once a
// banWarnEvery.
func (b *redisBans) warn(msg string, err error) {
	now := time.Now().UnixNano()
	last := b.lastWarn.Load()
	if now-last < int64(banWarnEvery) || !b.lastWarn.CompareAndSwap(last, now) {
		return
	}
	fields := []zap.Field{zap.Uint64("dropped_total", b.dropped.Load())}
	if err != nil {
		fields = append(fields, zap.Error(banError(err)))
	}
	b.s.log.Warn(msg, fields...)
}

// banError wraps a ban command's error, as ErrRedisCredentials too when the
// user may not run the command.
func banError(err error) error {
	if cmd, ok := noPermCommand(err); ok {
		if cmd == "" {
			cmd = "a ban registry command"
		}
		return fmt.Errorf("%w: the user may not run %s (grant it +%s, see the ACL line in docs/operations.md): %w", ErrRedisCredentials, cmd, cmd, err)
	}
	return err
}

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

// liftPrefix starts the message of a lift whose key starts with "!":
// "!lift <key> <bucket>". The lift of any other key is "<key> <bucket>",
// as it was before lifts had a type of their own, so that nodes of either
// version read it alike. Every other message of the ban channel starts
// with "!" and a type (see redisBans.message), and none has exactly one
// space: that shape is always a lift, "!<key> <bucket>" from a node that
// predates liftPrefix.
const liftPrefix = "!lift "

// liftMsg returns the ban channel's message of the lift of key's ban in
// bucket (neither holds a space: see ClientKey).
func liftMsg(key, bucket string) string {
	if strings.HasPrefix(key, "!") {
		return liftPrefix + key + " " + bucket
	}
	return key + " " + bucket
}

// parseLift reads a lift's message (see liftPrefix); ok is false for any
// other message.
func parseLift(msg string) (key, bucket string, ok bool) {
	if strings.HasPrefix(msg, "!") && strings.Count(msg, " ") != 1 {
		if msg, ok = strings.CutPrefix(msg, liftPrefix); !ok {
			return "", "", false
		}
	}
	key, bucket, ok = strings.Cut(msg, " ")
	return key, bucket, ok && key != "" && bucket != "" && !strings.Contains(bucket, " ")
}

const (
	// banLiftedKeep is how long the bans lifted lately are kept for the
	// subscribers that missed their message.
	banLiftedKeep = 10 * time.Minute
	// banLiftedMax is how many of them are kept at most.
	banLiftedMax = 1000
)

// banLiftedKey returns the Redis key of the bans lifted lately.
func (s *RedisStore) banLiftedKey() string { return s.prefix + "bans:{bans}!lifted" }

// forgetAgain is how long after a ban is lifted the deny caches forget it
// once more: the longest a decision sent before can take to come back
// (twice MaxWait, see RedisStore.extension), and a little.
func (s *RedisStore) forgetAgain() time.Duration { return 2*s.maxWait + 100*time.Millisecond }

// Unban implements BanKeeper: it lifts the key's ban in the zone for the
// whole fleet. The ban's time left is by this node's clock. When the ban
// was deleted but the registry or the channel failed, it returns the ban
// lifted and an error saying so: the other nodes' deny caches may then
// answer the ban until it ends.
func (s *RedisStore) Unban(ctx context.Context, zone, bucket, key string) (BanRecord, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, banTimeout)
	defer cancel()
	bk := s.Key(bucket, key)
	// One round trip to the bucket's node, not a transaction (MULTI is
	// one more command for the ACL): a ban that started between the GET
	// and the DEL is lifted all the same, and only reported as none.
	var get *redis.StringCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, bk+"!ban")
		p.Del(ctx, bk+"!ban", bk+"!den")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return BanRecord{}, false, fmt.Errorf("lifting the ban: %w", banError(err))
	}
	var rec BanRecord
	v, err := get.Result()
	lifted := err == nil
	if lifted {
		rec = banValue(zone, bucket, key, v, time.Now().UnixMicro())
		s.bans.caches.forget(bucket, key, s.forgetAgain())
	}
	msg := liftMsg(key, bucket)
	err = s.unlist(ctx, zone, bucket, key, msg, lifted)
	if lifted {
		// Only a ban that was in force can be in a deny cache: a cache
		// holds a ban no longer than Redis does.
		if e := s.client.Publish(ctx, s.banChannel(), msg).Err(); e != nil {
			err = orErr(err, e)
		}
	}
	if err != nil && lifted {
		return rec, true, fmt.Errorf("the ban is lifted in Redis, but other nodes may answer it from their deny caches until it ends: %w", banError(err))
	}
	if err != nil {
		return rec, false, fmt.Errorf("the ban registry: %w", banError(err))
	}
	return rec, lifted, nil
}

// banValue reads a ban's value in Redis ("end:start:denials", see
// the decide script) as a record, at microsecond now.
func banValue(zone, bucket, key, v string, now int64) BanRecord {
	n := banNote{zone: zone, bucket: bucket, key: key}
	parts := strings.SplitN(v, ":", 3)
	if len(parts) == 3 {
		n.end, _ = strconv.ParseInt(parts[0], 10, 64)
		n.start, _ = strconv.ParseInt(parts[1], 10, 64)
		n.denials, _ = strconv.ParseInt(parts[2], 10, 64)
	}
	return n.record(now)
}

// unlist takes the key's ban off the zone's registry and, when it was
// lifted, adds it, as msg, to the bans lifted lately.
func (s *RedisStore) unlist(ctx context.Context, zone, bucket, key, msg string, lifted bool) error {
	list := s.banListKey(zone)
	members, err := s.client.ZRange(ctx, list, 0, -1).Result()
	if err != nil {
		return err
	}
	pipe := s.client.Pipeline()
	for _, m := range members {
		if n, ok := parseBanMember(zone, m, 0); ok && n.key == key && n.bucket == bucket {
			pipe.ZRem(ctx, list, m)
		}
	}
	if lifted {
		recent, now := s.banLiftedKey(), time.Now().UnixMilli()
		pipe.ZAdd(ctx, recent, redis.Z{Score: float64(now), Member: msg})
		pipe.ZRemRangeByScore(ctx, recent, "-inf", strconv.FormatInt(now-banLiftedKeep.Milliseconds(), 10))
		pipe.ZRemRangeByRank(ctx, recent, 0, -banLiftedMax-1)
		pipe.PExpire(ctx, recent, banLiftedKeep)
	}
	if pipe.Len() == 0 {
		return nil
	}
	_, err = pipe.Exec(ctx)
	return err
}

// lifted makes the deny caches forget a ban lifted on another node (or on
// this one: forgetting twice is harmless).
func (b *redisBans) lifted(key, bucket string) {
	b.lifts.heard(key, bucket, time.Now().UnixMicro())
	b.caches.forget(bucket, key, b.s.forgetAgain())
}

// catchUp makes the deny caches forget the bans lifted since a minute
// before since (this node's clock; the lifting nodes' clocks may differ a
// little), which a subscriber that was down may have missed.
func (b *redisBans) catchUp(since time.Time) {
	ctx, cancel := context.WithTimeout(b.ctx, banTimeout)
	defer cancel()
	from := strconv.FormatInt(since.Add(-time.Minute).UnixMilli(), 10)
	msgs, err := b.s.client.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key: b.s.banLiftedKey(), Start: from, Stop: "+inf", ByScore: true,
	}).Result()
	if err != nil {
		b.warn("rate limit bans: the bans lifted while this node's subscription was down could not be read; its deny caches answer them until they end", err)
		return
	}
	for _, m := range msgs {
		if key, bucket, ok := parseLift(m); ok {
			b.lifted(key, bucket)
		}
	}
}
