package limiter

import (
	"context"
	"sync"
	"time"
)

// numShards is how many independently locked maps hold the buckets of a
// MemoryStore: enough that concurrent requests for different keys rarely
// meet on one lock.
const numShards = 64

type shard struct {
	mu   sync.Mutex
	m    map[bucketID]State
	peak int // largest len(m) since the map was last rebuilt
	_    [40]byte
}

// MemoryStore keeps buckets in this process: the same arithmetic as the
// Redis script, for a single node or for a zone that must not depend on
// Redis. Buckets that are full again are dropped by a sweeper, so memory
// follows the active clients.
type MemoryStore struct {
	hash   hasher
	shards [numShards]shard
	now    func() int64

	stop chan struct{}
	done chan struct{}
}

// NewMemoryStore returns an empty store whose sweeper drops full buckets
// every sweep interval (a minute when 0). now returns the current time in
// microseconds; nil means the system clock. Close stops the sweeper.
func NewMemoryStore(sweep time.Duration, now func() int64) *MemoryStore {
	if now == nil {
		now = func() int64 { return nodeClock().UnixMicro() }
	}
	if sweep <= 0 {
		sweep = time.Minute
	}
	s := &MemoryStore{
		hash: newHasher(),
		now:  now,
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[bucketID]State)
	}
	go s.sweeper(sweep)
	return s
}

// Decide implements Store. It never fails.
func (s *MemoryStore) Decide(_ context.Context, reqs []Request, results []Result) (bool, error) {
	var idBuf [8]bucketID
	var verdictBuf [8]verdict
	var lockBuf [8]uint8
	ids, verdicts, locks := idBuf[:0], verdictBuf[:0], lockBuf[:0]
	for i := range reqs {
		id := s.hash.id(reqs[i].Rule.Name, reqs[i].Key)
		ids = append(ids, id)
		locks = insertSorted(locks, id.shard())
	}
	for _, sh := range locks {
		s.shards[sh].mu.Lock()
	}
	now := s.now()
	admit := true
	for i := range reqs {
		sh := &s.shards[ids[i].shard()]
		v := reqs[i].Rule.check(sh.m[ids[i]], now, reqs[i].Cost)
		verdicts = append(verdicts, v)
		admit = admit && v.ok
	}
	for i := range reqs {
		r := reqs[i].Rule
		if admit && reqs[i].Cost > 0 {
			sh := &s.shards[ids[i].shard()]
			sh.m[ids[i]] = r.stateAt(now, verdicts[i].after)
			sh.peak = max(sh.peak, len(sh.m))
		}
		results[i] = r.result(verdicts[i], admit)
	}
	for _, sh := range locks {
		s.shards[sh].mu.Unlock()
	}
	return admit, nil
}

// Len returns how many buckets the store holds (full ones not yet swept
// included).
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every bucket that is full at the store's current time, and
// rebuilds maps that shrank to a quarter of their peak so that their memory
// is returned.
func (s *MemoryStore) Sweep() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for id, st := range sh.m {
			if st.FullAt() <= now {
				delete(sh.m, id)
			}
		}
		if sh.peak > 1024 && len(sh.m) < sh.peak/4 {
			m := make(map[bucketID]State, len(sh.m))
			for id, st := range sh.m {
				m[id] = st
			}
			sh.m, sh.peak = m, len(m)
		}
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
