package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The Redis store's ban registry: the bans the fleet's zones started, so
// that any node can list them. The node whose denial started a ban writes
// it, off the request path: the decision hands it to a bounded queue (a
// full queue drops it: the ban holds all the same, it is only not listed),
// and one goroutine per store sends what is queued.
//
// Layout, under the store's key prefix (every zone's list in one Cluster
// hash tag, so that listing them all is one round trip to one node; no key
// ends in "}", so none can be taken for a bucket):
//
//	<prefix>bans:{bans}:<zone>   sorted set of the zone's bans, scored by
//	                             their end (Redis microseconds); member
//	                             "<start> <denials> <key> <bucket>". Bans
//	                             that ended are pruned on every write and
//	                             read, and it keeps the MaxBanRecords that
//	                             end last. It expires a day after the end
//	                             of the last ban written.
//	<prefix>bans:{bans}!lifted   sorted set of the bans lifted lately (see
//	                             redisunban.go)
//
// The bans themselves are <bucket key>!ban, beside their buckets (see
// lua/decide.lua): the registry only names them.

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
	// listen is the channel's subscriber (redisunban.go).
	listen banListener
	// lifts are the lifts heard of lately (banstart.go).
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
		// while Redis is away (banstart.go).
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
