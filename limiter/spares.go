package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Prefetched spares, a decision's first layer (Limiter.decideSpares): tokens a
// store decision took beyond its cost, kept for this node's next requests of the
// key, paced, and refunded when unused.

// Errors of a rule's prefetch.
var (
	// ErrPrefetchNotApplicable: prefetch on an algorithm other than the
	// token bucket and the fixed window.
	ErrPrefetchNotApplicable = errors.New("prefetch applies to token_bucket and fixed_window only")
	// ErrBadPrefetch: a prefetch below 2 (a decision takes its cost
	// anyway) or a negative hold.
	ErrBadPrefetch = errors.New("prefetch must be at least 2 tokens, and its hold positive")
)

// DefaultPrefetchHold is how long a node keeps unused spares unless the
// rule says otherwise.
const DefaultPrefetchHold = 100 * time.Millisecond

// setPrefetch sets the rule's prefetch, while NewRule builds it.
func (r *Rule) setPrefetch(n int64, hold time.Duration) error {
	if n == 0 && hold == 0 {
		return nil
	}
	if r.alg != TokenBucket && r.alg != FixedWindow {
		return ErrPrefetchNotApplicable
	}
	if n < 2 || hold < 0 {
		return ErrBadPrefetch
	}
	if hold == 0 {
		hold = DefaultPrefetchHold
	}
	if r.dryRun {
		return nil // a dry run decides every request in the store
	}
	r.prefetch, r.prefetchHold = n, hold
	return nil
}

// Prefetch returns the most tokens a decision of the zone may take, and how
// long a node keeps the spares (0: no prefetch).
func (r *Rule) Prefetch() (int64, time.Duration) { return r.prefetch, r.prefetchHold }

// takeSpares adds to an admitted verdict the spares its decision takes, as
// the scripts' commit sections do (token bucket, fixed window).
func (r *Rule) takeSpares(v *verdict, cost int64) {
	if r.prefetch <= cost || r.dryRun {
		return
	}
	switch r.alg {
	case TokenBucket:
		if sp := min(r.prefetch-cost, (r.capacity-v.after-v.res)/r.interval/4); sp > 0 {
			v.after += sp * r.interval
			v.spares = sp
		}
	case FixedWindow:
		v.spares = max(0, min(r.prefetch-cost, (r.rate-v.curr-cost-v.res)/4))
	}
}

// fullSpares is how many spares a decision of cost that must keep reserve
// (in percent) takes from a full bucket (a window that counts nothing yet):
// the most any of its decisions can take, less than prefetch − cost where
// the burst (the window's limit) is small.
func (r *Rule) fullSpares(cost, reserve int64) int64 {
	v := verdict{ok: true, res: r.reserveUnits(reserve)}
	if r.alg == TokenBucket {
		v.after = cost * r.interval
	}
	r.takeSpares(&v, cost)
	return v.spares
}

// spareKey names a key's spares in one zone.
type spareKey struct {
	bucket, key string
}

// spare is what a node holds of a key's prefetched tokens.
type spare struct {
	rule *Rule
	key  string
	n    int64 // spares left
	// remaining is what the store reported at the prefetch (spares
	// included), less what this node has used since.
	remaining int64
	reset     time.Duration // the prefetch's ResetAfter
	at        int64         // the store's time of the prefetch (a window's refund)
	deadline  time.Time     // when the spares go back
	// pause is when the node may ask the store about the key again,
	// after a decision that found its bucket low (see Rule.pauseAfter).
	pause time.Time
}

// spares holds a limiter's prefetched tokens and refunds the unused
// ones.
type spares struct {
	mu sync.Mutex
	m  map[spareKey]*spare
	// stats are each prefetching zone's counts (PrefetchStats).
	stats map[*Rule]*prefetchCounts
	// flights are the keys this node is asking the store about for a
	// prefetching zone (spareFlight).
	flights map[spareKey]chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// newSpares returns an empty holder whose sweeper refunds expired
// spares through l every tick.
func newSpares(l *Limiter, tick time.Duration) *spares {
	s := &spares{m: make(map[spareKey]*spare), stats: make(map[*Rule]*prefetchCounts),
		flights: make(map[spareKey]chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go s.sweeper(l, tick)
	return s
}

// decideSpares is a decision's first layer: it admits, from the node's
// spares, the prefetching zones they cover, asks the deny cache's layer
// (decideCached) about the rest, and keeps the spares that decision took.
func (l *Limiter) decideSpares(ctx context.Context, reqs []Request, results []Result) Outcome {
	gen := l.resets.gen.Load() // a key reset during the decision drops its spares
	sp := l.spares.Load()
	if sp == nil {
		sp = l.startSpares(reqs)
	}
	if sp != nil {
		return l.decideWithSpares(ctx, sp, reqs, results, gen)
	}
	out := l.decideCached(ctx, reqs, results)
	if out == Allowed {
		l.keepSpares(reqs, results, gen)
	}
	return out
}

// decideWithSpares decides a request, admitting from the node's spares the
// prefetching zones they cover: a request they cover entirely needs no
// store call; otherwise the other zones are decided by the store, all or
// nothing, and a denial puts the spares taken back.
func (l *Limiter) decideWithSpares(ctx context.Context, sp *spares, reqs []Request, results []Result, gen uint64) Outcome {
	var localBuf [8]bool
	local := localBuf[:0]
	if len(reqs) > len(localBuf) {
		local = make([]bool, len(reqs))
	} else {
		local = localBuf[:len(reqs)]
	}
	var f spareFlight
	var now time.Time
	for {
		now = time.Now()
		covered, paced, wait := sp.take(reqs, results, local, now, &f)
		if paced {
			return Denied
		}
		if wait == nil {
			defer sp.land(&f)
			return l.decideUncovered(ctx, sp, reqs, results, local, covered, now, gen)
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return Canceled
		}
	}
}

// decideUncovered is decideWithSpares once take covered what it could; gen
// is the reset generation when the decision started (keyResets).
func (l *Limiter) decideUncovered(ctx context.Context, sp *spares, reqs []Request, results []Result, local []bool, covered int, now time.Time, gen uint64) Outcome {
	switch covered {
	case 0:
		out := l.decideCached(ctx, reqs, results)
		if out == Allowed {
			l.keepTaken(sp, reqs, results, gen)
		}
		if out == Allowed || out == Denied {
			sp.pace(reqs, results, now, out == Denied, l.staleSince(gen))
		}
		return out
	case len(reqs):
		sp.countHits(reqs, local)
		return Allowed
	}
	subReqs := make([]Request, 0, len(reqs)-covered)
	idx := make([]int, 0, len(reqs)-covered)
	for i := range reqs {
		if !local[i] {
			subReqs, idx = append(subReqs, reqs[i]), append(idx, i)
		}
	}
	subRes := make([]Result, len(subReqs))
	out := l.decideCached(ctx, subReqs, subRes)
	for j, i := range idx {
		results[i] = subRes[j]
	}
	if out == Allowed || out == Denied {
		sp.pace(subReqs, subRes, now, out == Denied, l.staleSince(gen))
	}
	switch out {
	case Allowed:
		sp.countHits(reqs, local)
		l.keepTaken(sp, subReqs, subRes, gen)
	case LocalAllowed, FailedOpen:
		// The request passes: the spares it used are spent.
	default:
		for i := range reqs {
			if local[i] {
				results[i] = Result{Allowed: true, Unknown: true}
			}
		}
		sp.putBack(reqs, local)
	}
	return out
}

// take admits, from the node's spares, the zones of reqs whose rule
// prefetches and whose spares cover the cost: it marks them in local and
// fills their results. It reports how many it covered, or that a zone
// whose key is paced denies the request (its result says until when; the
// others are Unknown, and nothing was taken), or that a store call of this
// node is in flight for a key the spares do not cover (wait closes when it
// lands; nothing was taken). Otherwise the keys the spares do not cover
// are claimed in f until f lands (see flights).
func (s *spares) take(reqs []Request, results []Result, local []bool, now time.Time, f *spareFlight) (covered int, paced bool, wait <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.n, f.more = 0, f.more[:0]
	for i := range reqs {
		q := &reqs[i]
		if q.Rule.prefetch == 0 || q.Cost <= 0 {
			continue
		}
		k := spareKey{q.Rule.bucket, q.Key}
		sp := s.m[k]
		if sp != nil && sp.rule == q.Rule {
			// The zone (its bucket and the spares) must keep the
			// request's reserve, as the store would have it. A request
			// the spares do not cover goes to the store, unless the key
			// is paced and its class is low: what the zone held lately,
			// less the request's cost and reserve, would not give a
			// decision all the spares a full bucket gives it.
			left := sp.remaining - q.Cost - q.Rule.reserveTokens(q.Reserve)
			if sp.n >= q.Cost && now.Before(sp.deadline) && left >= 0 {
				sp.n -= q.Cost
				sp.remaining -= q.Cost
				local[i] = true
				results[i] = Result{Allowed: true, Remaining: max(0, sp.remaining), ResetAfter: sp.reset, at: sp.at,
					Delay: q.Rule.shedDelayLeft(sp.remaining, q.Cost)}
				covered++
				continue
			}
			if now.Before(sp.pause) && left < 4*q.Rule.fullSpares(q.Cost, q.Reserve) {
				s.undo(reqs, local)
				for j := range results {
					results[j] = Result{Allowed: true, Unknown: true}
				}
				results[i] = Result{RetryAfter: sp.pause.Sub(now), ResetAfter: sp.reset}
				s.counts(q.Rule).paced.Add(1)
				return 0, true, nil
			}
		}
		if ch := s.flights[k]; ch != nil {
			s.undo(reqs, local)
			return 0, false, ch
		}
		f.add(k)
	}
	for _, k := range f.keys[:f.n] {
		s.flights[k] = make(chan struct{})
	}
	return covered, false, nil
}

// countHits counts a hit for each zone of an admitted request that its
// spares covered.
func (s *spares) countHits(reqs []Request, local []bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range reqs {
		if local[i] {
			s.counts(reqs[i].Rule).hits.Add(1)
		}
	}
}

// putBack returns to the spares what take took for zones that another zone
// of the request denied.
func (s *spares) putBack(reqs []Request, local []bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.undo(reqs, local)
}

// undo is putBack with the holder locked.
func (s *spares) undo(reqs []Request, local []bool) {
	for i := range reqs {
		if !local[i] {
			continue
		}
		if sp := s.m[spareKey{reqs[i].Rule.bucket, reqs[i].Key}]; sp != nil {
			sp.n += reqs[i].Cost
			sp.remaining += reqs[i].Cost
		}
		local[i] = false
	}
}

// pace starts the pause of each prefetching zone whose store decision (at
// now) took fewer spares than a full bucket gives it (see Rule.pauseAfter).
// Of a denied request, only the zones that denied it: one that would have admitted it
// took no spares because another zone denied, not because it runs low. A
// key reset since the decision was sent (stale: keyResets) is not paced.
func (s *spares) pace(reqs []Request, results []Result, now time.Time, denied bool, stale func(spareKey) bool) {
	for i := range reqs {
		q, res := &reqs[i], &results[i]
		r := q.Rule
		if r.prefetch == 0 || res.Unknown || q.Cost <= 0 || stale(spareKey{r.bucket, q.Key}) {
			continue
		}
		c := s.countsOf(r)
		c.decisions.Add(1)
		if denied && res.Allowed {
			continue
		}
		if res.spares >= r.fullSpares(q.Cost, q.Reserve) {
			continue
		}
		c.short.Add(1)
		pause := r.pauseAfter(q, res)
		if pause <= 0 {
			continue
		}
		k := spareKey{r.bucket, q.Key}
		s.mu.Lock()
		sp := s.m[k]
		if sp == nil || sp.rule != r {
			if sp != nil && sp.n > 0 {
				s.mu.Unlock()
				continue // keep spares of another rule; they expire
			}
			sp = &spare{rule: r, key: q.Key, deadline: now}
			s.m[k] = sp
		}
		sp.pause = now.Add(pause)
		if sp.reset == 0 {
			sp.reset = res.ResetAfter
		}
		sp.remaining = res.Remaining // what the zone holds now, spares included
		s.mu.Unlock()
	}
}

// pauseAfter is how long a node leaves a key alone after a store decision
// that took fewer spares than a full bucket gives it (pacing: fullSpares;
// a decision that took those took all it could, and waiting gains it
// nothing): the time the zone's rate takes to refill the spares it
// missed; never longer than the bucket
// takes to fill up from what the decision left (no token is lost to a full
// bucket while the nodes wait; a fixed window is full again when its window
// ends), nor half the hold. (A pause multiplied by
// the nodes of the fleet view halved the calls again, but admitted 0.54 to
// 0.99 of what a saturated key could reach in fleetsim, against 0.93 to
// 0.996 without; the calls stay within 0.2 per admission with prefetch 20.)
func (r *Rule) pauseAfter(q *Request, res *Result) time.Duration {
	missed := r.fullSpares(q.Cost, q.Reserve) - res.spares
	need := min(missed, r.burst-(res.Remaining-res.spares))
	if missed <= 0 || need <= 0 {
		return 0
	}
	pause := min(r.prefetchHold/2, time.Duration(float64(r.per)*float64(need)/float64(r.rate)))
	if r.alg == FixedWindow {
		pause = min(pause, res.ResetAfter)
	}
	return pause
}

// keep records the spares a decision took, at now, but those of keys
// reset since the decision was sent (stale: the bucket charged for them is
// gone, so they are dropped). A key's older spares, if any are left, go
// back in the returned list (to be refunded).
func (s *spares) keep(reqs []Request, results []Result, now time.Time, stale func(spareKey) bool) (back []*spare) {
	for i := range reqs {
		res := &results[i]
		if res.spares <= 0 || !res.Allowed || res.Unknown || stale(spareKey{reqs[i].Rule.bucket, reqs[i].Key}) {
			continue
		}
		r := reqs[i].Rule
		hold := r.prefetchHold
		if r.alg == FixedWindow && res.ResetAfter < hold {
			hold = res.ResetAfter // the spares count in this window only
		}
		sp := &spare{rule: r, key: reqs[i].Key, n: res.spares, remaining: res.Remaining,
			reset: res.ResetAfter, at: res.at, deadline: now.Add(hold)}
		k := spareKey{r.bucket, reqs[i].Key}
		s.mu.Lock()
		s.counts(r).taken.Add(uint64(res.spares))
		if old := s.m[k]; old != nil {
			switch {
			case old.n <= 0:
			case old.rule == r && (r.alg != FixedWindow || old.at/r.windowUS == res.at/r.windowUS):
				// Spares of a decision that was in flight with this one
				// join them, and go back with them.
				sp.n += old.n
				sp.remaining += old.n
			default:
				back = append(back, old)
			}
			sp.pause = old.pause
		}
		s.m[k] = sp
		s.mu.Unlock()
	}
	return back
}

// drop forgets a key's spares without refunding them (Limiter.ResetKey: the key
// was reset, and the bucket charged for them with it).
func (s *spares) drop(k spareKey) {
	s.mu.Lock()
	delete(s.m, k)
	s.mu.Unlock()
}

// expired removes and returns the spares whose deadline is past at now
// (all of them with now zero).
func (s *spares) expired(now time.Time) []*spare {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*spare
	for k, sp := range s.m {
		if now.IsZero() || (!now.Before(sp.deadline) && !now.Before(sp.pause)) {
			delete(s.m, k)
			if sp.n > 0 {
				out = append(out, sp)
			}
		} else if !now.Before(sp.deadline) && sp.n > 0 {
			out = append(out, &spare{rule: sp.rule, key: sp.key, n: sp.n, at: sp.at})
			sp.n = 0
		}
	}
	return out
}

// refundSpares refunds unused spares to the store.
func (l *Limiter) refundSpares(list []*spare) {
	for _, sp := range list {
		req := []Request{{Rule: sp.rule, Key: sp.key, Cost: sp.n}}
		res := []Result{{Allowed: true, at: sp.at}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := l.store.Refund(ctx, req, res); err == nil {
			if h := l.spares.Load(); h != nil {
				c := h.countsOf(sp.rule)
				c.returned.Add(uint64(sp.n))
				c.refunds.Add(1)
			}
		}
		cancel()
	}
}

// sweeper refunds expired spares every tick, and all of them when the
// holder stops.
func (s *spares) sweeper(l *Limiter, tick time.Duration) {
	defer close(s.done)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			l.refundSpares(s.expired(time.Time{}))
			return
		case now := <-t.C:
			if list := s.expired(now); len(list) > 0 {
				l.refundSpares(list)
			}
		}
	}
}

// prefetchTick is how often expired spares are looked for: a small share
// of the default hold.
const prefetchTick = 20 * time.Millisecond

// keepSpares keeps the spares an admitted decision took, starting the
// holder on the first ones. After Close it refunds them at once.
func (l *Limiter) keepSpares(reqs []Request, results []Result, gen uint64) {
	for i := range results {
		if results[i].spares > 0 {
			l.sparesMu.Lock()
			if l.closed {
				l.sparesMu.Unlock()
				l.refundSpares(takenSpares(reqs, results))
				return
			}
			sp := l.spares.Load()
			if sp == nil {
				sp = newSpares(l, prefetchTick)
				l.spares.Store(sp)
			}
			l.sparesMu.Unlock()
			l.keepTaken(sp, reqs, results, gen)
			sp.pace(reqs, results, time.Now(), false, l.staleSince(gen))
			return
		}
	}
}

// startSpares starts the holder of spares for a request with a
// prefetching zone, so that its first decisions already share their store
// calls (spareFlight); nil for a request without one, or after
// Close.
func (l *Limiter) startSpares(reqs []Request) *spares {
	any := false
	for i := range reqs {
		any = any || reqs[i].Rule.prefetch > 0
	}
	if !any {
		return nil
	}
	l.sparesMu.Lock()
	defer l.sparesMu.Unlock()
	if l.closed {
		return nil
	}
	sp := l.spares.Load()
	if sp == nil {
		sp = newSpares(l, prefetchTick)
		l.spares.Store(sp)
	}
	return sp
}

// takenSpares lists the spares a decision took, to refund them.
func takenSpares(reqs []Request, results []Result) []*spare {
	var list []*spare
	for i := range results {
		if res := &results[i]; res.spares > 0 && res.Allowed && !res.Unknown {
			list = append(list, &spare{rule: reqs[i].Rule, key: reqs[i].Key, n: res.spares, at: res.at})
		}
	}
	return list
}

// staleSince returns whether a key was reset after generation gen (the
// generation of keyResets when a decision started).
func (l *Limiter) staleSince(gen uint64) func(spareKey) bool {
	return func(k spareKey) bool { return l.resets.since(gen, k) }
}

// keepTaken records the spares of an admitted decision that started at
// reset generation gen; older spares it replaces go back in the
// background.
func (l *Limiter) keepTaken(sp *spares, reqs []Request, results []Result, gen uint64) {
	if back := sp.keep(reqs, results, time.Now(), l.staleSince(gen)); len(back) > 0 {
		go l.refundSpares(back)
	}
}

// spareFlight is the keys one request claimed, to land when its decision is
// kept.
type spareFlight struct {
	keys [4]spareKey
	n    int
	more []spareKey // beyond the fourth
}

// add claims k.
func (f *spareFlight) add(k spareKey) {
	if f.n < len(f.keys) {
		f.keys[f.n] = k
		f.n++
		return
	}
	f.more = append(f.more, k)
}

// land ends the store calls f claimed, waking the requests waiting for
// them.
func (s *spares) land(f *spareFlight) {
	if f.n == 0 && len(f.more) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range f.keys[:f.n] {
		s.end(k)
	}
	for _, k := range f.more {
		s.end(k)
	}
	f.n, f.more = 0, f.more[:0]
}

// end closes and forgets the spareFlight of k; the holder is locked.
func (s *spares) end(k spareKey) {
	if ch := s.flights[k]; ch != nil {
		close(ch)
		delete(s.flights, k)
	}
}

// PrefetchStats are what a node's prefetch did for one zone (or for all
// of a limiter's zones), since the limiter's first spares.
type PrefetchStats struct {
	// Hits counts requests the zone admitted from spares, without the
	// store.
	Hits uint64 `json:"hits"`
	// Paced counts requests denied on this node while the zone's key was
	// paced, without the store.
	Paced uint64 `json:"paced"`
	// Decisions counts the zone's decisions by the store; Short those of
	// them that took fewer spares than a full bucket gives (they start a
	// pause).
	Decisions uint64 `json:"decisions"`
	Short     uint64 `json:"short"`
	// Taken counts the spare tokens taken, Returned those refunded
	// unused, in Refunds store calls.
	Taken    uint64 `json:"taken"`
	Returned uint64 `json:"returned"`
	Refunds  uint64 `json:"refunds"`
}

// Minus returns the counts that s has more than an earlier o: what
// happened between the two.
func (s PrefetchStats) Minus(o PrefetchStats) PrefetchStats {
	return PrefetchStats{
		Hits: s.Hits - o.Hits, Paced: s.Paced - o.Paced, Decisions: s.Decisions - o.Decisions, Short: s.Short - o.Short,
		Taken: s.Taken - o.Taken, Returned: s.Returned - o.Returned, Refunds: s.Refunds - o.Refunds,
	}
}

// prefetchCounts are one zone's PrefetchStats as they grow.
type prefetchCounts struct {
	hits, paced, decisions, short, taken, returned, refunds atomic.Uint64
}

// load returns the counts as they are now.
func (c *prefetchCounts) load() PrefetchStats {
	return PrefetchStats{
		Hits: c.hits.Load(), Paced: c.paced.Load(), Decisions: c.decisions.Load(), Short: c.short.Load(),
		Taken: c.taken.Load(), Returned: c.returned.Load(), Refunds: c.refunds.Load(),
	}
}

// add adds o to s.
func (s *PrefetchStats) add(o PrefetchStats) {
	s.Hits += o.Hits
	s.Paced += o.Paced
	s.Decisions += o.Decisions
	s.Short += o.Short
	s.Taken += o.Taken
	s.Returned += o.Returned
	s.Refunds += o.Refunds
}

// counts returns the counts of a zone's rule, made on first use; the
// holder must be locked.
func (s *spares) counts(r *Rule) *prefetchCounts {
	c := s.stats[r]
	if c == nil {
		c = &prefetchCounts{}
		s.stats[r] = c
	}
	return c
}

// countsOf is counts with the holder unlocked.
func (s *spares) countsOf(r *Rule) *prefetchCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts(r)
}

// PrefetchStats reports what the limiter's prefetch did for the zone of
// rule r, or for all its zones with r nil.
func (l *Limiter) PrefetchStats(r *Rule) PrefetchStats {
	sp := l.spares.Load()
	if sp == nil {
		return PrefetchStats{}
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if r != nil {
		if c := sp.stats[r]; c != nil {
			return c.load()
		}
		return PrefetchStats{}
	}
	var all PrefetchStats
	for _, c := range sp.stats {
		all.add(c.load())
	}
	return all
}
