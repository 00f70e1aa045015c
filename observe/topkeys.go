package observe

import (
	"hash/maphash"
	"sort"
	"strings"
	"sync"
)

// The top denied keys, and the top denied client networks (a second sketch
// per zone, keyed by networkKey): a Space-Saving sketch
// (Metwally, Agrawal and El Abbadi, 2005) of topPerShard counters in each
// of topShards shards, keys spread over the shards by hash so that each
// shard's lock is rarely contended and the shards' summaries never overlap.
// Space-Saving finds every key denied more than 1/topPerShard of its
// shard's denials, with counts that may be high by at most the reported
// error. Two generations of topWindow seconds are kept, so the table shows
// who is denied now, not who was an hour ago.
const (
	topShards   = 8
	topPerShard = 32
	topWindow   = 60
	topReport   = 10
)

type topKeys struct {
	seed   maphash.Seed
	shards [topShards]topShard
}

type topShard struct {
	mu        sync.Mutex
	epoch     int64 // the topWindow of cur; prev holds the one before, or nothing
	cur, prev spaceSaving
	_         [64]byte // keeps shards' locks off each other's cache lines
}

type spaceSaving struct {
	idx   map[string]int
	items []topItem
}

type topItem struct {
	key   string
	count uint64
	over  uint64 // how much count may exceed the key's true count
}

func newTopKeys() *topKeys { return &topKeys{seed: maphash.MakeSeed()} }

// add counts one denial of key at unix second sec.
func (t *topKeys) add(key string, sec int64) {
	sh := t.lock(maphash.String(t.seed, key), sec)
	sh.cur.add(key)
	sh.mu.Unlock()
}

// addBytes counts one denial of the key spelt by key's bytes at unix
// second sec. It allocates only when the sketch takes the key in.
func (t *topKeys) addBytes(key []byte, sec int64) {
	sh := t.lock(maphash.Bytes(t.seed, key), sec)
	if i, ok := sh.cur.idx[string(key)]; ok {
		sh.cur.items[i].count++
	} else {
		sh.cur.insert(string(key))
	}
	sh.mu.Unlock()
}

// lock locks and returns the shard of a key's hash, its generations moved
// on to unix second sec.
func (t *topKeys) lock(hash uint64, sec int64) *topShard {
	sh := &t.shards[hash%topShards]
	epoch := sec / topWindow
	sh.mu.Lock()
	if epoch > sh.epoch {
		if epoch == sh.epoch+1 {
			sh.prev, sh.cur = sh.cur, sh.prev
		} else {
			sh.prev.reset()
		}
		sh.cur.reset()
		sh.epoch = epoch
	}
	return sh
}

func (s *spaceSaving) reset() {
	clear(s.idx)
	clear(s.items)
	s.items = s.items[:0]
}

func (s *spaceSaving) add(key string) {
	if i, ok := s.idx[key]; ok {
		s.items[i].count++
		return
	}
	// The key may point into a request's memory: keep a copy.
	s.insert(strings.Clone(key))
}

// insert takes in a key the sketch does not hold, which it keeps as it is.
func (s *spaceSaving) insert(k string) {
	if s.idx == nil {
		s.idx = make(map[string]int, topPerShard)
		s.items = make([]topItem, 0, topPerShard)
	}
	if len(s.items) < topPerShard {
		s.idx[k] = len(s.items)
		s.items = append(s.items, topItem{key: k, count: 1})
		return
	}
	m := 0
	for i := 1; i < len(s.items); i++ {
		if s.items[i].count < s.items[m].count {
			m = i
		}
	}
	delete(s.idx, s.items[m].key)
	s.idx[k] = m
	s.items[m] = topItem{key: k, count: s.items[m].count + 1, over: s.items[m].count}
}

// keys returns every key the sketch holds, in either window.
func (t *topKeys) keys() []string {
	var out []string
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, s := range []*spaceSaving{&sh.cur, &sh.prev} {
			for _, it := range s.items {
				out = append(out, it.key)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// top returns the n keys denied most in the current and the previous
// window at unix second now, and the unix second the data starts from.
func (t *topKeys) top(now int64, n int) ([]topItem, int64) {
	epoch := now / topWindow
	merged := map[string]topItem{}
	addAll := func(s *spaceSaving) {
		for _, it := range s.items {
			m := merged[it.key]
			m.key = it.key
			m.count += it.count
			m.over += it.over
			merged[it.key] = m
		}
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		switch sh.epoch {
		case epoch:
			addAll(&sh.cur)
			addAll(&sh.prev)
		case epoch - 1:
			addAll(&sh.cur)
		}
		sh.mu.Unlock()
	}
	items := make([]topItem, 0, len(merged))
	for _, it := range merged {
		items = append(items, it)
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].count != items[j].count {
			return items[i].count > items[j].count
		}
		return items[i].key < items[j].key
	})
	if len(items) > n {
		items = items[:n]
	}
	return items, (epoch - 1) * topWindow
}
