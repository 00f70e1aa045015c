package limiter

import (
	"context"
	"slices"
	"sync"
	"time"
)

// The memory store's ban registry: the bans its zones started in this
// process, by bucket and key, at most MaxBanRecords per zone. The bans
// themselves are beside the buckets (membans.go), by bucket id, which does
// not say the key: the registry is what can name them.

// banKey names a ban in its zone's registry.
type banKey struct{ bucket, key string }

// banRegistry is a MemoryStore's list of bans, by zone, and its deny caches
// (a memory store seldom has any: see Options.Cache).
type banRegistry struct {
	mu        sync.Mutex
	zones     map[string]map[banKey]banNote
	lastPrune int64 // when a full zone was last pruned (store microseconds)
	caches    cacheSet
}

// banPruneEvery is how often a full zone's registry is pruned of the bans
// that ended, at most: pruning reads the whole zone, and a ban is recorded
// on the request path.
const banPruneEvery = int64(time.Second / time.Microsecond)

// banSamples is how many bans a full zone samples to find the one that
// makes room: the one ending first among them (map iteration starts at a
// random place), as the memory store evicts buckets.
const banSamples = 8

// recordBan implements banRecorder: it keeps the ban. A full zone makes
// room by pruning the bans that ended (at most once a second), else by
// dropping the ban that ends first among a few sampled: the cost of a ban
// on the request path stays small however many keys a flood gets banned.
func (s *MemoryStore) recordBan(n banNote) {
	g := &s.banList
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.zones == nil {
		g.zones = make(map[string]map[banKey]banNote)
	}
	notes := g.zones[n.zone]
	if notes == nil {
		notes = make(map[banKey]banNote)
		g.zones[n.zone] = notes
	}
	k := banKey{n.bucket, n.key}
	if _, ok := notes[k]; !ok && len(notes) >= MaxBanRecords {
		if n.start-g.lastPrune >= banPruneEvery {
			g.lastPrune = n.start
			prune(notes, n.start)
		}
		if len(notes) >= MaxBanRecords {
			var first banKey
			end, seen := int64(0), 0
			for k, o := range notes {
				if seen == 0 || o.end < end {
					first, end = k, o.end
				}
				if seen++; seen == banSamples {
					break
				}
			}
			delete(notes, first)
		}
	}
	notes[k] = n
}

// prune drops from a zone's bans those that ended at now.
func prune(notes map[banKey]banNote, now int64) {
	for k, n := range notes {
		if n.end <= now {
			delete(notes, k)
		}
	}
}

// Bans implements BanKeeper: the bans in force in this process's zones
// named, at most limit per zone, those that end last first.
func (s *MemoryStore) Bans(_ context.Context, zones []string, limit int) ([]BanRecord, error) {
	now := s.now()
	var out []BanRecord
	seen := make(map[string]bool, len(zones))
	g := &s.banList
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, z := range zones {
		notes := g.zones[z]
		if seen[z] || len(notes) == 0 {
			continue // a zone named twice is listed once
		}
		seen[z] = true
		prune(notes, now)
		list := make([]banNote, 0, len(notes))
		for _, n := range notes {
			list = append(list, n)
		}
		slices.SortFunc(list, func(a, b banNote) int { return cmpEnd(a.end, b.end) })
		for i := range list[:min(len(list), max(0, limit))] {
			out = append(out, list[i].record(now))
		}
		if len(notes) == 0 {
			delete(g.zones, z)
		}
	}
	sortBans(out)
	return out, nil
}

// cmpEnd orders ban ends latest first.
func cmpEnd(a, b int64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// Unban implements BanKeeper: it lifts the key's ban in this process, and
// forgets the denials counted towards the next one.
func (s *MemoryStore) Unban(_ context.Context, zone, bucket, key string) (BanRecord, bool, error) {
	id := s.hash.id(bucket, key)
	sh := &s.shards[id.shard()]
	sh.mu.Lock()
	now := s.now()
	b := sh.bans[id]
	lifted := sh.unban(id, now)
	sh.mu.Unlock()

	g := &s.banList
	g.mu.Lock()
	delete(g.zones[zone], banKey{bucket, key})
	g.mu.Unlock()
	// A decision reads the store at once: a second forget a moment later
	// is enough for one that read the ban just before it was lifted.
	g.caches.forget(bucket, key, time.Second)
	if !lifted {
		return BanRecord{}, false, nil
	}
	n := banNote{zone: zone, bucket: bucket, key: key, start: b.banStart, end: b.banEnd, denials: b.banDenials}
	return n.record(now), true, nil
}

// denyCaches implements cacheHolder.
func (s *MemoryStore) denyCaches() *cacheSet { return &s.banList.caches }
