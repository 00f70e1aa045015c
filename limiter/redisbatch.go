package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The batcher: decisions queue as calls, and pipeline workers send every call
// waiting in one pipeline.

// maxBatch bounds how many decisions share one round trip.
const maxBatch = 256

// slotRefundRetry is how long a worker with no decisions to send waits before
// it tries again the slot refunds that could not reach Redis.
const slotRefundRetry = 100 * time.Millisecond

// call is one script call travelling to a pipeline worker and back.
type call struct {
	script *redis.Script
	keys   []string // per zone: its bucket, rule and cost
	rules  []*Rule
	costs  []int64
	aux    []any // per zone: see zoneAux
	reply  []any
	err    error
	done   chan struct{}

	// trip numbers the round trip that carried the call (0 until one
	// does), for the circuit breaker.
	trip atomic.Uint64

	// 0 pending, 1 delivered to a waiting caller, 2 abandoned by a
	// caller that gave up (the worker then refunds its charges, and
	// returns a call from the pool to it: who is done with it last).
	state  atomic.Uint32
	pooled bool
	timer  *time.Timer
	// until is, for a refund of slots whose decision's reply was lost,
	// when their lease ends: it is tried again until then (RedisStore.refundCall).
	until time.Time
}

// callPool recycles the calls of single-call decisions, with their
// channel, timer and slices.
var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1), pooled: true} }}

// deliver hands a finished call back to its caller and reports true, or
// reports false if the caller gave up on it.
func (c *call) deliver() bool {
	if c.state.CompareAndSwap(0, 1) {
		c.done <- struct{}{}
		return true
	}
	return false
}

// abandon marks the call given up by its caller and reports true, or
// reports false if it was delivered meanwhile (its reply is then in done).
func (c *call) abandon() bool { return c.state.CompareAndSwap(0, 2) }

// putCall empties a call and returns it to the pool.
func putCall(c *call) {
	clear(c.keys)
	clear(c.rules)
	clear(c.aux)
	c.keys, c.rules, c.costs, c.aux, c.reply, c.err, c.script = c.keys[:0], c.rules[:0], c.costs[:0], c.aux[:0], nil, nil, nil
	c.state.Store(0)
	c.trip.Store(0)
	callPool.Put(c)
}

// worker is a pipeline worker: it takes every call queued, up to
// maxBatch, and sends them in one round trip, until the store closes.
func (s *RedisStore) worker(inFlight *atomic.Pointer[flight]) {
	defer s.wg.Done()
	batch := make([]*call, 0, maxBatch)
	var p pipeline
	for {
		var retry <-chan time.Time // slot refunds wait to be tried again
		if s.slotRefunds.waiting() {
			retry = time.After(slotRefundRetry)
		}
		batch = batch[:0]
		select {
		case c := <-s.queue:
			batch = append(batch, c)
		case <-retry:
		case <-s.stop:
			return
		}
	drain:
		for len(batch) > 0 && len(batch) < maxBatch {
			select {
			case c := <-s.queue:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		if len(batch) > 0 {
			s.run(&p, batch, inFlight)
			clear(batch)
		}
		if len(p.refunds) > 0 || s.slotRefunds.waiting() {
			// Refunds: their own replies refund nothing. Slot
			// refunds whose Redis could not be reached are kept to
			// try again after a later batch (or slotRefundRetry), until
			// their lease ends.
			//
			// back is a list of its own: running it appends to
			// p.refunds the slot refunds of its calls whose replies were
			// lost (a refund of an abandoned call cut by a CLIENT KILL), which
			// wait for the next round. (They were cleared unsent, and
			// shared back's array: such a refund's slots stayed held for
			// their lease.)
			back := append(append([]*call(nil), p.refunds...), s.slotRefunds.take()...)
			clear(p.refunds)
			p.refunds = p.refunds[:0]
			s.run(&p, back, inFlight)
			s.slotRefunds.keepFailed(back, time.Now())
			s.slotRefunds.keepUnsent(p.refunds)
			clear(p.refunds)
			p.refunds = p.refunds[:0]
		}
	}
}

// scriptCall is one EVALSHA of a pipeline: the decide script for a batch
// of calls (every waiting decision, or in a Cluster those of one slot), or
// the refund script for one call.
type scriptCall struct {
	script *redis.Script
	calls  []*call
	cmd    *redis.Cmd
}

// pipeline is a worker's reusable grouping of a batch into script calls.
type pipeline struct {
	groups []scriptCall
	slots  map[int]int // Cluster: slot to index in groups
	rules  []*Rule     // a script call's distinct rules
	keys   []string    // a script call's distinct buckets
	// buckets maps a script call's buckets to their index in keys, from 1.
	buckets map[string]int
	// zones holds, per zone of the script call's calls in order, the index
	// of its rule and of its bucket (from 1).
	zones []int
	// refunds holds the refunds of the batch's abandoned decisions that
	// Redis charged (RedisStore.refundCall), sent after the batch.
	refunds []*call
	// clock is this node's clock, which the quotas' calendars are read
	// at (their periods around it go with the rule; see Rule.quotaArgs). Nil:
	// the node's default clock.
	clock Clock
}

// nodeNow returns this node's time in microseconds.
func (p *pipeline) nodeNow() int64 { return clockOr(p.clock).Now().UnixMicro() }

// group sorts a batch into script calls: the decisions into one (per slot
// in a Cluster, where a script's keys must share a slot), each refund into
// its own.
func (s *RedisStore) group(p *pipeline, batch []*call) []scriptCall {
	for i := range p.groups {
		clear(p.groups[i].calls)
		p.groups[i] = scriptCall{calls: p.groups[i].calls[:0]}
	}
	p.groups = p.groups[:0]
	if s.cluster {
		if p.slots == nil {
			p.slots = make(map[int]int)
		}
		clear(p.slots)
	}
	add := func(script *redis.Script, c *call) int {
		if len(p.groups) < cap(p.groups) {
			p.groups = p.groups[:len(p.groups)+1]
		} else {
			p.groups = append(p.groups, scriptCall{})
		}
		g := &p.groups[len(p.groups)-1]
		g.script, g.calls = script, append(g.calls, c)
		return len(p.groups) - 1
	}
	decide := -1
	for _, c := range batch {
		switch {
		case c.script == s.refund:
			add(s.refund, c)
		case s.cluster:
			slot := keySlot(c.keys[0])
			if g, ok := p.slots[slot]; ok {
				p.groups[g].calls = append(p.groups[g].calls, c)
			} else {
				p.slots[slot] = add(s.script, c)
			}
		case decide >= 0:
			p.groups[decide].calls = append(p.groups[decide].calls, c)
		default:
			decide = add(s.script, c)
		}
	}
	return p.groups
}

// run sends a batch in one pipeline. A pipelined EVALSHA cannot fall back to
// EVAL by itself, so script calls answered NOSCRIPT (Redis restarted,
// failed over, or SCRIPT FLUSH) are sent again once their script is loaded:
// NOSCRIPT means the script did not run, so nothing is charged twice. So
// are those answered TRYAGAIN (a Cluster slot in migration), after a short
// pause.
func (s *RedisStore) run(p *pipeline, batch []*call, inFlight *atomic.Pointer[flight]) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.maxWait)
	defer cancel()
	batch = s.live(batch)
	if len(batch) == 0 {
		return
	}
	trip := s.trips.Add(1)
	for _, c := range batch {
		c.trip.Store(trip)
	}
	left := s.stall.mark()
	inFlight.Store(&flight{trip: trip, left: left})
	defer inFlight.Store(nil)
	groups := s.group(p, batch)
	s.exec(ctx, p, groups)
	s.timeTrip(left, groups)
	s.resend(ctx, p, groups)
	for i := range groups {
		s.deliver(p, &groups[i])
	}
}

// live returns the calls of batch to send, in batch's backing array:
// decisions whose callers gave up waiting in the queue are not sent (their
// requests already took the failure policy); refunds always are.
func (s *RedisStore) live(batch []*call) []*call {
	live := batch[:0]
	for _, c := range batch {
		if c.script != s.refund && c.state.Load() == 2 {
			if c.pooled {
				putCall(c)
			}
			continue
		}
		live = append(live, c)
	}
	return live
}

// resend sends again, up to three times, the script calls answered
// NOSCRIPT (once their scripts are loaded) or TRYAGAIN (after a short
// pause), and sets their new commands in groups.
func (s *RedisStore) resend(ctx context.Context, p *pipeline, groups []scriptCall) {
	var again []scriptCall
	for attempt := 0; attempt < 3; attempt++ {
		var pos []int
		var load []*redis.Script
		tryAgain := false
		again = again[:0]
		for i := range groups {
			switch err := groups[i].cmd.Err(); {
			case isNoScript(err):
				again, pos = append(again, groups[i]), append(pos, i)
				if !containsScript(load, groups[i].script) {
					load = append(load, groups[i].script)
				}
			case redis.IsTryAgainError(err):
				again, pos = append(again, groups[i]), append(pos, i)
				tryAgain = true
			}
		}
		if len(again) == 0 {
			break
		}
		for _, sc := range load {
			if err := sc.Load(ctx, s.client).Err(); err != nil {
				again = again[:0] // report the NOSCRIPT errors as they are
			}
		}
		if len(again) == 0 {
			break
		}
		if tryAgain {
			select {
			case <-time.After(2 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		s.exec(ctx, p, again)
		for j, i := range pos {
			groups[i].cmd = again[j].cmd
		}
	}
}

// timeTrip records how long a round trip that left at left took, when
// Redis answered it (an answer that is an error reply counts; a failed
// connection or a timeout does not: a hung Redis must not teach the store
// to wait longer for it).
func (s *RedisStore) timeTrip(left stallMark, groups []scriptCall) {
	for i := range groups {
		if err := groups[i].cmd.Err(); err != nil {
			var reply redis.Error
			if !errors.As(err, &reply) {
				return
			}
		}
	}
	took, _ := s.stall.since(left)
	s.slow.add(took, left.at+int64(took))
}

// deliver hands each call of a script call its part of the reply, or the
// error; the charges of a decision whose caller gave up go back (p's
// refunds).
func (s *RedisStore) deliver(p *pipeline, g *scriptCall) {
	if g.script == s.refund {
		c := g.calls[0]
		if c.err = g.cmd.Err(); c.err != nil {
			c.err = s.cmdErr(c.err)
		}
		if slotRefund := s.slotRefundCall(c); slotRefund != nil {
			p.refunds = append(p.refunds, slotRefund)
		}
		if !c.deliver() && c.pooled {
			putCall(c)
		}
		return
	}
	reply, err := g.cmd.Slice()
	if err != nil {
		err = s.cmdErr(err)
	}
	o := 0
	for _, c := range g.calls {
		w := replyLen(len(c.keys))
		switch {
		case err != nil:
			c.err = err
		case o+w > len(reply):
			c.err = fmt.Errorf("redis: unexpected script reply of %d values for %d zones in %d requests", len(reply), len(c.keys), len(g.calls))
		default:
			if e, ok := reply[o].(error); ok {
				c.err = &requestError{e}
			} else {
				c.reply = reply[o : o+w : o+w]
			}
		}
		o += w
		// Slots a lost reply may have taken go back whoever waits
		// (RedisStore.refundCall); read before c may return to the pool.
		slotRefund := s.slotRefundCall(c)
		if slotRefund != nil {
			p.refunds = append(p.refunds, slotRefund)
		}
		if c.deliver() {
			continue // the last use of c: its caller may return it to the pool
		}
		if back := s.refundCall(c); back != nil { // an answer: no slot refund
			p.refunds = append(p.refunds, back)
		}
		if c.pooled {
			putCall(c)
		}
	}
}

// containsScript reports whether list holds sc.
func containsScript(list []*redis.Script, sc *redis.Script) bool {
	for _, x := range list {
		if x == sc {
			return true
		}
	}
	return false
}

// cmdErr wraps a command's error. A socket deadline or the batch's context
// running out is a timeout like the caller's own, so it is ErrStoreTimeout
// too: whichever fires first, callers can tell a hung Redis apart.
func (s *RedisStore) cmdErr(err error) error {
	var ne net.Error // context.DeadlineExceeded is one as well
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w (%s): redis: %w", ErrStoreTimeout, 2*s.maxWait, err)
	}
	return fmt.Errorf("redis: %w", err)
}

// exec sends script calls in one pipeline and sets each one's command (see
// scriptArgs for its arguments).
func (s *RedisStore) exec(ctx context.Context, p *pipeline, groups []scriptCall) {
	clock := "0"
	if s.clock != nil {
		clock = strconv.FormatInt(s.clock.Now().UnixMicro(), 10)
	}
	p.clock = s.clock // nil: the node's own
	pipe := s.client.Pipeline()
	for i := range groups {
		g := &groups[i]
		g.cmd = redis.NewCmd(ctx, p.scriptArgs(g, clock, g.script == s.script)...)
		_ = pipe.Process(ctx, g.cmd)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// Each command carries its own error, except when the connection
		// failed its set-up with a Redis reply (AUTH or HELLO refused:
		// WRONGPASS, NOAUTH): go-redis then sets it on no command, which
		// would read as an empty reply. A command that was answered never
		// has neither value nor error (a nil reply is redis.Nil).
		for i := range groups {
			if cmd := groups[i].cmd; cmd.Err() == nil && cmd.Val() == nil {
				cmd.SetErr(err)
			}
		}
	}
}

// isNoScript reports whether err is Redis' NOSCRIPT reply.
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}
