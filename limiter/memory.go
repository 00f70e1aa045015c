package limiter

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// numShards is how many independently locked maps hold the buckets of a
// MemoryStore: enough that concurrent requests for different keys rarely
// meet on one lock.
const numShards = 64

type shard struct {
	mu   sync.Mutex
	m    bucketTable             // the buckets (all but sliding logs)
	logs map[bucketID]*logBucket // sliding logs, kept apart: they hold slices
	bans map[bucketID]banEntry   // denial counts and bans (see banEntry)
	// rebuilt holds the quotas that outage charges rebuilt lately, and
	// what they added (quotaOutageCharge); nil until one is.
	rebuilt map[bucketID]memEntry
	_       [8]byte
}

// memEntry is a bucket in memory: its state and the microsecond from which
// it counts nothing any more (then it is as good as absent).
type memEntry struct {
	state   State
	expires int64
}

// logBucket is a sliding log in memory.
type logBucket struct {
	entries []logEntry
	expires int64
}

// MemoryStore keeps buckets in this process: the same arithmetic as the
// Redis script, for a single node or for a zone that must not depend on
// Redis. Buckets that are full again are dropped by a sweeper, so memory
// follows the active clients; with a key limit (SetMaxKeys) a flood of new
// keys cannot grow it further: a new key then evicts the bucket closest to
// full (see evict).
type MemoryStore struct {
	hash   hasher
	shards [numShards]shard
	clock  Clock
	// perShard is the most buckets a shard holds (0: no limit), and
	// maxKeys the bound it was set from (SetMaxKeys).
	perShard atomic.Int64
	maxKeys  atomic.Int64

	evictMu   sync.Mutex
	evictions map[uint32]uint64 // by zone tag

	banList banRegistry // the bans started here, by key
	lims    limiterSet  // the limiters told of keys reset

	sweep chan time.Duration // a new sweep interval for the sweeper
	stop  chan struct{}
	done  chan struct{}
}

// evictionSamples is how many buckets a full shard looks at to find the
// one to evict: the one closest to full among them (Redis samples five for
// its approximated eviction; a few more cost nothing here and come closer
// to the true minimum).
const evictionSamples = 8

// MemoryOptions configures a MemoryStore.
type MemoryOptions struct {
	// Sweep is how often the sweeper drops full buckets. Default 1 minute.
	Sweep time.Duration
	// Clock is the store's time: its buckets count wall-clock
	// microseconds (Now().UnixMicro()). Default: the system clock.
	Clock Clock
}

// NewMemoryStore returns an empty store, without a key limit, whose sweeper
// drops full buckets every opt.Sweep. Close stops the sweeper.
func NewMemoryStore(opt MemoryOptions) *MemoryStore {
	sweep := opt.Sweep
	if sweep <= 0 {
		sweep = time.Minute
	}
	s := &MemoryStore{
		hash:      newHasher(),
		clock:     clockOr(opt.Clock),
		evictions: make(map[uint32]uint64),
		sweep:     make(chan time.Duration, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].logs = make(map[bucketID]*logBucket)
		s.shards[i].bans = make(map[bucketID]banEntry)
	}
	go s.sweeper(sweep)
	return s
}

// now returns the store's time in microseconds.
func (s *MemoryStore) now() int64 { return s.clock.Now().UnixMicro() }

// Clock returns the store's clock (MemoryOptions.Clock, or this node's
// default clock).
func (s *MemoryStore) Clock() Clock { return s.clock }

// Decide implements Store. It never fails.
func (s *MemoryStore) Decide(_ context.Context, reqs []Request, results []Result) (bool, error) {
	boundCosts(reqs)
	if len(reqs) == 1 {
		return s.decideOne(&reqs[0], &results[0]), nil
	}
	var idBuf [8]bucketID
	var verdictBuf [8]verdict
	var lockBuf [8]uint8
	ids, verdicts, locks := idBuf[:0], verdictBuf[:0], lockBuf[:0]
	for i := range reqs {
		id := s.hash.id(reqs[i].Rule.bucket, reqs[i].Key)
		ids = append(ids, id)
		locks = insertSorted(locks, id.shard())
	}
	limit := int(s.perShard.Load())
	for _, sh := range locks {
		s.shards[sh].mu.Lock()
	}
	now := s.now()
	admit := true
	for i := range reqs {
		v := s.check(&s.shards[ids[i].shard()], ids[i], &reqs[i], now)
		verdicts = append(verdicts, v)
		admit = admit && (v.ok || reqs[i].Rule.dryRun)
	}
	for i := range reqs {
		r, cost := reqs[i].Rule, reqs[i].Cost
		charged := admit && verdicts[i].ok
		if charged && cost > 0 {
			r.takeSpares(&verdicts[i], cost)
			s.commit(&s.shards[ids[i].shard()], ids[i], r, verdicts[i], now, cost, limit)
		}
		results[i] = r.result(verdicts[i], charged, cost)
		results[i].at = now
	}
	for _, sh := range locks {
		s.shards[sh].mu.Unlock()
	}
	return admit, nil
}

// decideOne is Decide for a request of one zone, the common case: the
// same steps without the arrays a request of several zones needs (a
// smaller stack frame, which connection goroutines would otherwise grow
// their stacks for again after every garbage collection).
func (s *MemoryStore) decideOne(q *Request, res *Result) bool {
	id := s.hash.id(q.Rule.bucket, q.Key)
	sh := &s.shards[id.shard()]
	limit := int(s.perShard.Load())
	sh.mu.Lock()
	now := s.now()
	v := s.check(sh, id, q, now)
	r, cost := q.Rule, q.Cost
	admit := v.ok || r.dryRun
	if v.ok && cost > 0 {
		r.takeSpares(&v, cost)
		s.commit(sh, id, r, v, now, cost, limit)
	}
	*res = r.result(v, v.ok, cost)
	res.at = now
	sh.mu.Unlock()
	return admit
}

// check decides one zone of a request at microsecond now, in its locked
// shard: its ban first, then its algorithm; a denial counts towards a ban.
func (s *MemoryStore) check(sh *shard, id bucketID, q *Request, now int64) verdict {
	r := q.Rule
	if r.ban.enabled() {
		if v, banned := sh.banned(id, now); banned {
			return v
		}
	}
	res := r.reserveUnits(q.Reserve)
	var v verdict
	if r.alg == SlidingLog {
		if lb := sh.logs[id]; lb != nil {
			v, lb.entries = r.logCheck(lb.entries, now, q.Cost, res)
		} else {
			v, _ = r.logCheck(nil, now, q.Cost, res)
		}
	} else {
		e, _ := sh.m.get(id)
		if e.expires <= now {
			e.state = 0
		}
		v = r.check(e.state, now, q.Cost, res)
	}
	if !v.ok && r.ban.enabled() {
		if _, counted := sh.bans[id]; !counted {
			s.makeRoom(sh, int(s.perShard.Load()), now)
		}
		v.banStarted = sh.denied(id, r, now)
	}
	return v
}

// commit charges an admitted request's zone in its locked shard.
func (s *MemoryStore) commit(sh *shard, id bucketID, r *Rule, v verdict, now, cost int64, limit int) {
	if r.alg == SlidingLog {
		lb := sh.logs[id]
		if lb == nil {
			s.makeRoom(sh, limit, now)
			lb = &logBucket{}
			sh.logs[id] = lb
		}
		lb.entries = append(lb.entries, logEntry{t: now, cost: cost})
		lb.expires = now + r.windowUS
		return
	}
	if limit > 0 && !sh.m.has(id) {
		s.makeRoom(sh, limit, now)
	}
	st, exp := r.commit(v, now, cost)
	sh.m.put(id, memEntry{state: st, expires: exp})
}

// Refund implements Store: it refunds what Decide charged the zones of
// reqs, which results (Decide's) says were charged at which time. A
// window refunds only what the window that counted the charge still
// counts; a concurrency zone frees the request's slot. A dry-run zone that
// would have denied was not charged: it gets nothing back.
func (s *MemoryStore) Refund(_ context.Context, reqs []Request, results []Result) error {
	boundCosts(reqs)
	for i := range reqs {
		r, cost := reqs[i].Rule, reqs[i].Cost
		if cost <= 0 || results[i].DryRun {
			continue
		}
		id := s.hash.id(r.bucket, reqs[i].Key)
		sh := &s.shards[id.shard()]
		sh.mu.Lock()
		now := s.now()
		if r.alg == SlidingLog {
			if lb := sh.logs[id]; lb != nil {
				lb.entries = logRefund(lb.entries, results[i].at, cost)
			}
		} else if e, ok := sh.m.get(id); ok && e.expires > now {
			if st, exp, keep := r.refund(e, now, cost, results[i].at); keep {
				sh.m.put(id, memEntry{state: st, expires: exp})
			} else {
				sh.m.remove(id)
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// makeRoom evicts entries (buckets, then denial counts and bans) from a
// shard that holds limit entries or more (limit 0: no limit), so that one
// more fits. The shard is locked.
func (s *MemoryStore) makeRoom(sh *shard, limit int, now int64) {
	for limit > 0 && sh.m.n+len(sh.logs)+len(sh.bans) >= limit {
		zone, lost, ok := sh.evict(now)
		if !ok {
			zone, lost, ok = sh.evictBan(now)
		}
		if !ok {
			return
		}
		if lost {
			s.evictMu.Lock()
			s.evictions[zone]++
			s.evictMu.Unlock()
		}
	}
}

// evict drops the bucket closest to full among a few sampled ones (map
// iteration starts at a random place), and reports its zone and whether it
// was not yet full: a bucket that is full already loses nothing, and is
// taken at once.
//
// What an eviction can over-admit: the client of an evicted bucket starts
// again from a full bucket, so it may pass at most the tokens its bucket
// still lacked (at most the zone's burst, or for the windows the requests
// still counted), once per eviction. The bucket chosen is the one that
// would have been full again soonest among those sampled, that is the one
// that lacks the least time of refill; a bucket that a client keeps
// draining (a limited hot key) is far from full and is not chosen while
// fresher ones are there. A concurrency key's slots, held until refunded,
// are never full: they are taken only when the sample holds nothing else
// (the key's client may then have more requests in flight).
func (sh *shard) evict(now int64) (zone uint32, lost, ok bool) {
	victim, best, found := sh.m.sample(evictionSamples, now)
	isLog := false
	if !found {
		best = math.MaxInt64
	}
	if best > now {
		n := 0
		for id, lb := range sh.logs {
			if !found || lb.expires < best {
				victim, best, isLog, found = id, lb.expires, true, true
			}
			if n++; n == evictionSamples/2 || best <= now {
				break
			}
		}
	}
	if !found {
		return 0, false, false // no bucket to evict
	}
	if isLog {
		delete(sh.logs, victim)
	} else {
		sh.m.remove(victim)
	}
	return victim.zone(), best > now, true
}

// SetMaxKeys bounds how many buckets the store holds: past it, a new key
// evicts the bucket closest to full (see evict). 0 means no limit. The bound
// holds per shard, each holding n/64 rounded up (at least one), so it is
// reached when the keys spread evenly, as their keyed hashes make them do,
// and the store may hold up to 63 buckets more than n.
func (s *MemoryStore) SetMaxKeys(n int) {
	n = max(n, 0)
	s.maxKeys.Store(int64(n))
	if n == 0 {
		s.perShard.Store(0)
		return
	}
	s.perShard.Store(int64(max(1, (n+numShards-1)/numShards)))
}

// MaxKeys returns the key limit as SetMaxKeys set it (0: none).
func (s *MemoryStore) MaxKeys() int { return int(s.maxKeys.Load()) }

// SetSweepInterval changes how often the sweeper drops full buckets (0
// leaves it as it is).
func (s *MemoryStore) SetSweepInterval(d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-s.sweep: // an older value not yet taken
	default:
	}
	s.sweep <- d
}

// Evictions returns how many buckets of the zone whose buckets are named
// bucket (Rule.Bucket()) were evicted before they were full to make room for
// new keys.
func (s *MemoryStore) Evictions(bucket string) uint64 {
	tag := s.hash.tag(bucket)
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	return s.evictions[tag]
}

// Len returns how many entries the store holds: buckets (full ones not
// yet swept included), and the denial counts and bans of zones that ban.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.m.n + len(sh.logs) + len(sh.bans)
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every bucket that is full at the store's current time, and
// shrinks the tables left less than an eighth full so that their memory is
// returned.
func (s *MemoryStore) Sweep() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		sh.m.sweep(now)
		for id, lb := range sh.logs {
			if lb.expires <= now {
				delete(sh.logs, id)
			}
		}
		sh.sweepBans(now)
		sh.mu.Unlock()
	}
}

// Close stops the sweeper. The store must not be used afterwards.
func (s *MemoryStore) Close() error {
	close(s.stop)
	<-s.done
	return nil
}

func (s *MemoryStore) sweeper(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case d := <-s.sweep:
			t.Reset(d)
		case <-t.C:
			s.Sweep()
		}
	}
}

// insertSorted adds v to the sorted set a unless it is there already.
func insertSorted(a []uint8, v uint8) []uint8 {
	i := 0
	for i < len(a) && a[i] < v {
		i++
	}
	if i < len(a) && a[i] == v {
		return a
	}
	a = append(a, 0)
	copy(a[i+1:], a[i:])
	a[i] = v
	return a
}

// Interface guard.
var _ Store = (*MemoryStore)(nil)
