package limiter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// A key looked up and reset in Redis (KeyKeeper), and the reset told to every
// node.

// resetPrefix starts a key reset's message on the ban channel: "!reset
// <key> <bucket> [<bucket> …]". Keys and bucket names hold no space.
const resetPrefix = "!reset "

// keysTimeout bounds a lookup's or a reset's round trips.
const keysTimeout = 2 * time.Second

// peekScript is the peek script, loaded on first use.
var peekScript = redis.NewScript(lua.Peek)

// Peek implements KeyKeeper: one call of the peek script, by Redis' clock.
func (s *RedisStore) Peek(ctx context.Context, rules []*Rule, key string) ([]KeyState, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, keysTimeout)
	defer cancel()
	keys, args := s.peekArgs(rules, key)
	v, err := peekScript.Run(ctx, s.client, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("reading the key's buckets: %w", banError(err))
	}
	return decodePeek(v, rules)
}

// peekArgs returns the peek script's KEYS and ARGV for key under rules:
// the decide script's layout (package lua's positions), each rule a zone of its own with cost
// 0 and no reserve, and the clock Redis TIME (or the store's test clock).
func (s *RedisStore) peekArgs(rules []*Rule, key string) ([]string, []any) {
	var keys []string
	zoneKey := make([]int, len(rules)) // the index in keys, from 1
	for i, r := range rules {
		k := s.Key(r.bucket, key)
		ki := slices.Index(keys, k)
		if ki < 0 {
			keys = append(keys, k)
			ki = len(keys) - 1
		}
		zoneKey[i] = ki + 1
	}
	clock := "0"
	if s.clock != nil {
		clock = fmt.Sprint(s.clock.Now().UnixMicro())
	}
	args := make([]any, lua.ArgRules, lua.ArgRules+len(rules)*(lua.RuleArgs+1+lua.KindArgs)+1)
	args[lua.ArgClock-1], args[lua.ArgRules-1] = clock, len(rules)
	nodeNow := clockOr(s.clock).Now().UnixMicro()
	for _, r := range rules {
		if r.alg == Quota { // the periods around this node's time (Rule.quotaArgs)
			args = append(args, r.quotaArgs(nodeNow)...)
			continue
		}
		args = append(args, r.scriptArgs()...)
	}
	for i := range rules {
		// Zone i is a request of its own, of kind i+1.
		args = append(args, lua.PackZone(i+1, zoneKey[i], len(keys), true))
	}
	for i := range rules {
		kind := make([]any, lua.KindArgs)
		kind[lua.KindRule-1], kind[lua.KindCost-1], kind[lua.KindAux-1] = i+1, 0, 0
		args = append(args, kind...)
	}
	return keys, append(args, len(rules))
}

// decodePeek reads the peek script's reply for rules.
func decodePeek(v any, rules []*Rule) ([]KeyState, error) {
	reply, ok := v.([]any)
	if !ok || len(reply) != lua.PeekLen(len(rules)) {
		return nil, fmt.Errorf("redis: unexpected reply of the peek script for %d zones", len(rules))
	}
	nums := make([]int64, len(reply))
	for i, x := range reply {
		if nums[i], ok = x.(int64); !ok {
			return nil, fmt.Errorf("redis: unexpected value %T in the peek script's reply", x)
		}
	}
	now := nums[0]
	out := make([]KeyState, len(rules))
	for i, r := range rules {
		z := nums[1+i*lua.PeekZone:]
		var vals zoneReply
		copy(vals[:], z[:lua.ReplyZone])
		st := keyState(r, r.fromReply(vals, 0), now)
		st.BanLeft, st.BanDenials = us(z[lua.PeekBanLeft-1]), z[lua.PeekBanDenials-1]
		st.Denials = z[lua.PeekDenials-1]
		out[i] = st
	}
	return out, nil
}

// ResetKey implements KeyKeeper: it deletes the key's buckets of rules in
// Redis, makes this node's limiters forget them, and tells every node.
// When the buckets were deleted but the message could not be sent, it
// returns their count and an error saying so: the other nodes' deny caches
// may then deny the key until their cached state is full again.
func (s *RedisStore) ResetKey(ctx context.Context, rules []*Rule, key string) (int, error) {
	buckets := resetBuckets(rules)
	if len(buckets) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, keysTimeout)
	defer cancel()
	// The local fallback buckets live in each node's memory only: the
	// message resets them. Deleted one by one in a pipeline, so that a
	// Cluster client sends each to its slot's node (all the same node:
	// the key is the hash tag).
	var dels []*redis.IntCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range rules {
			if r.alg != Concurrency {
				dels = append(dels, p.Del(ctx, s.Key(r.bucket, key)))
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("deleting the key's buckets: %w", banError(err))
	}
	n := 0
	for _, d := range dels {
		n += int(d.Val())
	}
	s.lims.forget(buckets, key)
	msg := resetPrefix + key + " " + strings.Join(buckets, " ")
	if err := s.client.Publish(ctx, s.banChannel(), msg).Err(); err != nil {
		return n, fmt.Errorf("the key's buckets are reset in Redis, but other nodes may deny it from their deny caches until their cached state is full: %w", banError(err))
	}
	return n, nil
}

// reset makes this node's limiters forget a key reset on another node (or
// on this one: forgetting twice is harmless), from its message.
func (b *redisBans) reset(msg string) {
	f := strings.Fields(strings.TrimPrefix(msg, resetPrefix))
	if len(f) < 2 {
		return
	}
	b.s.lims.forget(f[1:], f[0])
}

// limiters implements limiterHolder.
func (s *RedisStore) limiters() *limiterSet { return &s.lims }
