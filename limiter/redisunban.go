package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Lifting a ban in Redis, across the fleet. Unban deletes the ban and the
// denials counted towards the next one (one round trip to the bucket's
// slot): from then on no decision finds it. It makes this node's deny caches
// forget the key, takes the ban off the registry, and publishes its lift
// (liftMsg) on the store's ban channel, <prefix>bans. Every node's
// store subscribes to the channel (one connection per store: go-redis's
// PubSub, which reconnects and subscribes again by itself; this works alike
// on one server, under Sentinel and on a Cluster, where a message reaches
// every node) and makes its deny caches forget the key as the message
// arrives.
//
// A node whose subscription was down when a ban was lifted has missed the
// message. So Unban also adds the ban to <prefix>bans:{bans}!lifted, scored
// by the lifting node's clock in milliseconds and kept banLiftedKeep, and a
// subscriber that subscribes again after a failure forgets every ban lifted
// there since shortly before its failure.

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
	// banPing is how long the subscriber waits for a message before it
	// pings, and then for the reply before it starts over on a new
	// connection: a connection that died without a word is noticed.
	banPing = 30 * time.Second
	// banRetryMax is the longest pause between two attempts to subscribe
	// while Redis is away: short, because a subscription that comes back
	// also ends the breaker's open state (breakerclose.go), and an attempt
	// on a server that is down costs a refused dial.
	banRetryMax = 200 * time.Millisecond
	// banRefusedRetry is how long the subscriber waits before it tries
	// again when Redis refuses it the channel (an ACL without it).
	banRefusedRetry = time.Minute
)

// banChannel returns the store's ban channel.
func (s *RedisStore) banChannel() string { return s.prefix + "bans" }

// banLiftedKey returns the Redis key of the bans lifted lately.
func (s *RedisStore) banLiftedKey() string { return s.prefix + "bans:{bans}!lifted" }

// forgetAgain is how long after a ban is lifted the deny caches forget it
// once more: the longest a decision sent before can take to come back
// (twice MaxWait, see patience.go), and a little.
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
// lua/decide.lua) as a record, at microsecond now.
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

// banListener is a store's subscriber to its ban channel.
type banListener struct {
	mu     sync.Mutex
	ps     *redis.PubSub
	closed bool
}

// use makes ps the subscriber's connection, closing the one before; it
// reports false (and closes ps) once the subscriber is closed.
func (l *banListener) use(ps *redis.PubSub) bool {
	l.mu.Lock()
	old, closed := l.ps, l.closed
	if !closed {
		l.ps = ps
	}
	l.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	if closed {
		_ = ps.Close()
	}
	return !closed
}

// close closes the subscriber's connection and stops it.
func (l *banListener) close() {
	l.mu.Lock()
	ps := l.ps
	l.closed = true
	l.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
}

// isClosed reports whether the subscriber was closed.
func (l *banListener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// subscribe opens a new subscription to the ban channel (connecting, and
// retrying later, in the background).
func (l *banListener) subscribe(ctx context.Context, b *redisBans) (*redis.PubSub, bool) {
	ps := b.s.client.Subscribe(ctx)
	if !l.use(ps) {
		return nil, false
	}
	_ = ps.Subscribe(ctx, b.s.banChannel()) // a failure shows in the receive
	return ps, true
}

// run receives the ban channel's messages until the store closes.
func (l *banListener) run(b *redisBans) {
	ctx := b.ctx
	stop := ctx.Done()
	closed := make(chan struct{})
	go func() { // closing the connection ends a receive that waits
		defer close(closed)
		<-stop
		l.close()
	}()
	defer func() { <-closed }()
	ps, ok := l.subscribe(ctx, b)
	if !ok {
		return
	}
	var (
		pause    time.Duration
		pinged   bool
		failedAt time.Time // when the subscription last failed; zero while it holds
	)
	for {
		msg, err := ps.ReceiveTimeout(ctx, banPing)
		if l.isClosed() {
			return
		}
		switch {
		case err == nil:
			pinged = false
			switch m := msg.(type) {
			case *redis.Subscription:
				pause = 0
				if !failedAt.IsZero() {
					b.s.breaker.Close() // Redis answers again (breakerclose.go)
					b.catchUp(failedAt)
					failedAt = time.Time{}
				}
			case *redis.Message:
				b.message(m.Payload)
			}
			continue
		case isTimeout(err) && !pinged:
			pinged = true
			_ = ps.Ping(ctx)
			continue
		case isTimeout(err):
			// Neither a message nor the ping's reply: the connection
			// died without a word. Start over on a new one.
			pinged = false
			if failedAt.IsZero() {
				failedAt = time.Now().Add(-2 * banPing)
			}
			if ps, ok = l.subscribe(ctx, b); !ok {
				return
			}
			continue
		}
		if failedAt.IsZero() {
			failedAt = time.Now()
		}
		if _, refused := noPermCommand(err); refused {
			b.warn("redis refuses the ban channel to this user: a ban lifted on another node stays in this node's deny cache until it ends", err)
			if !sleepOrStop(banRefusedRetry, stop) {
				return
			}
			_ = ps.Subscribe(ctx, b.s.banChannel())
			continue
		}
		// Redis is away: go-redis dials again on the next receive.
		pause = min(max(2*pause, 100*time.Millisecond), banRetryMax)
		if !sleepOrStop(pause, stop) {
			return
		}
	}
}

// isTimeout reports whether err is a read that timed out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sleepOrStop waits d, and reports false if stop was closed meanwhile.
func sleepOrStop(d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}
