package limiter

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The Cluster path: one script call per slot, and the slots that admitted
// refunded when another denied.

// decideBySlot decides a request whose zones' buckets may sit on several
// Cluster slots: one script call per slot, all in one pipeline. When one
// slot denies, the slots that admitted (and so charged) are refunded, so
// that a denied request is charged to no zone. Between the charge and the
// refund another request may find those buckets emptier than they will
// be: a refund can cause a denial, never an admission beyond the limit.
func (s *RedisStore) decideBySlot(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	groups := s.groupBySlot(reqs)
	if len(groups) == 1 {
		c := s.newCall(s.script, reqs, nil, nil)
		if err := s.send(ctx, c); err != nil {
			return false, err
		}
		return decodeReply(c.reply, reqs, results)
	}
	calls := make([]*call, len(groups))
	for g, idx := range groups {
		calls[g] = s.newCall(s.script, reqs, idx, nil)
	}
	errs := s.sendAll(ctx, calls)
	admitted := make([]bool, len(groups))
	all := true
	var firstErr error
	for g, idx := range groups {
		if errs[g] != nil {
			all = false
			firstErr = orErr(firstErr, errs[g])
			continue
		}
		sub := subset(reqs, idx)
		subRes := make([]Result, len(idx))
		ok, err := decodeReply(calls[g].reply, sub, subRes)
		if err != nil {
			all = false
			firstErr = orErr(firstErr, err)
			continue
		}
		admitted[g] = ok
		all = all && ok
		for j, i := range idx {
			results[i] = subRes[j]
		}
	}
	if all {
		return true, nil
	}
	firstErr = orErr(firstErr, s.refundSlots(ctx, reqs, results, groups, calls, admitted))
	if firstErr != nil {
		return false, firstErr
	}
	return false, nil
}

// groupBySlot groups the zones of a request by the slot of their bucket,
// keeping each group in request order: indexes into reqs.
func (s *RedisStore) groupBySlot(reqs []Request) [][]int {
	var slotBuf [8]int
	slots := slotBuf[:0]
	for i := range reqs {
		slots = append(slots, keySlot(s.Key(reqs[i].Rule.bucket, reqs[i].Key)))
	}
	var groups [][]int
	for i, sl := range slots {
		placed := false
		for g := range groups {
			if slots[groups[g][0]] == sl {
				groups[g] = append(groups[g], i)
				placed = true
				break
			}
		}
		if !placed {
			groups = append(groups, []int{i})
		}
	}
	return groups
}

// refundSlots refunds what the admitting slots (groups whose decide
// call in calls admitted) charged, and reports their zones as not charged.
// It returns the first error of the refunds.
func (s *RedisStore) refundSlots(ctx context.Context, reqs []Request, results []Result, groups [][]int, calls []*call, admitted []bool) error {
	var refunds []*call
	// A refund refunds the cost and the spares a prefetching zone took.
	taken := make([]Request, len(reqs))
	copy(taken, reqs)
	for g, idx := range groups {
		if !admitted[g] {
			continue
		}
		sub := subset(reqs, idx)
		subRes := make([]Result, len(idx))
		if _, err := decodeReplyAs(calls[g].reply, sub, subRes, false); err == nil {
			for j, i := range idx {
				results[i] = subRes[j]
			}
		}
		for _, i := range idx {
			taken[i].Cost += results[i].spares
			results[i].spares = 0
		}
		refunds = append(refunds, s.newCall(s.refund, taken, idx, results))
	}
	var firstErr error
	for _, err := range s.sendAll(ctx, refunds) {
		firstErr = orErr(firstErr, err)
	}
	return firstErr
}

// orErr keeps the first error.
func orErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// subset returns the requests of reqs at the indexes idx.
func subset(reqs []Request, idx []int) []Request {
	sub := make([]Request, len(idx))
	for j, i := range idx {
		sub[j] = reqs[i]
	}
	return sub
}

// newCall prepares a call of script (decide or refund) for the zones idx of
// reqs (all zones when idx is nil); done is nil for a decision, Decide's
// results for a refund (see fill).
func (s *RedisStore) newCall(script *redis.Script, reqs []Request, idx []int, done []Result) *call {
	c := &call{done: make(chan struct{}, 1)}
	s.fill(c, script, reqs, idx, done)
	return c
}

// send queues one call for the pipeline workers and waits for its reply.
func (s *RedisStore) send(ctx context.Context, c *call) error {
	select {
	case s.queue <- c:
	case <-ctx.Done():
		return s.ctxErr(ctx)
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		if c.abandon() {
			return s.ctxErr(ctx) // the worker refunds its charges
		}
		<-c.done // delivered as we gave up: use it
		return c.err
	}
}

// sendAll queues calls together, so that they share a pipeline, and waits
// for every reply.
func (s *RedisStore) sendAll(ctx context.Context, calls []*call) []error {
	errs := make([]error, len(calls))
	queued := 0
	for _, c := range calls {
		select {
		case s.queue <- c:
			queued++
		case <-ctx.Done():
		}
	}
	for i, c := range calls {
		if i >= queued {
			errs[i] = s.ctxErr(ctx)
			continue
		}
		select {
		case <-c.done:
			errs[i] = c.err
		case <-ctx.Done():
			if c.abandon() {
				errs[i] = s.ctxErr(ctx) // the worker refunds its charges
				continue
			}
			<-c.done // delivered as we gave up: use it
			errs[i] = c.err
		}
	}
	return errs
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// keySlot returns the Redis Cluster hash slot of a key: CRC16 (XMODEM) of
// its hash tag (the part between the first '{' and the next '}', when that
// is not empty) or of the whole key, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}
