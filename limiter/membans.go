package limiter

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Bans in the memory store: per bucket the denials counted and the ban, and
// the registry that names them by key.

// banEntry is a bucket's ban state: denials counted until countEnd, and a
// ban from banStart until banEnd after banDenials denials (microseconds).
type banEntry struct {
	denials, countEnd            int64
	banStart, banEnd, banDenials int64
}

// banned reports whether the bucket id is banned at now, with the verdict
// that says so.
func (sh *shard) banned(id bucketID, now int64) (verdict, bool) {
	b, ok := sh.bans[id]
	if !ok || b.banEnd <= now {
		return verdict{}, false
	}
	return verdict{banned: true, banLeft: b.banEnd - now, banDenials: b.banDenials}, true
}

// denied counts a denial of the bucket id by rule r at now, and reports
// whether it started a ban (in a dry run: would have; no ban is kept).
func (sh *shard) denied(id bucketID, r *Rule, now int64) bool {
	b := sh.bans[id]
	if b.countEnd <= now {
		b.denials, b.countEnd = 0, now+r.banWindowUS
	}
	b.denials++
	if b.denials < r.banAfter {
		sh.bans[id] = b
		return false
	}
	if !r.dryRun {
		b.banStart, b.banEnd, b.banDenials = now, now+r.banUS, b.denials
	}
	b.denials, b.countEnd = 0, 0
	if b.banEnd <= now {
		delete(sh.bans, id)
	} else {
		sh.bans[id] = b
	}
	return true
}

// unban lifts the ban of bucket id and forgets its denials; it reports
// whether a ban was in force at now.
func (sh *shard) unban(id bucketID, now int64) bool {
	b, ok := sh.bans[id]
	delete(sh.bans, id)
	return ok && b.banEnd > now
}

// sweepBans drops the ban states that count nothing any more at now.
func (sh *shard) sweepBans(now int64) {
	for id, b := range sh.bans {
		if b.banEnd <= now && b.countEnd <= now {
			delete(sh.bans, id)
		}
	}
}

// evictBan drops a denial count, or if every entry sampled holds a ban in
// force, the ban that ends soonest among them, and reports its zone,
// whether it lost anything, and whether there was an entry to drop. A ban
// in force is the last entry a full shard gives up: its key then gets its
// bucket again (an evicted bucket's allowance, see evict).
func (sh *shard) evictBan(now int64) (zone uint32, lost, ok bool) {
	var victim bucketID
	var end int64
	n := 0
	for id, b := range sh.bans {
		if !ok || b.banEnd < end {
			victim, end, ok = id, b.banEnd, true
		}
		if n++; n == evictionSamples || end <= now {
			break
		}
	}
	if !ok {
		return 0, false, false
	}
	b := sh.bans[victim]
	delete(sh.bans, victim)
	return victim.zone(), b.banEnd > now || (b.denials > 0 && b.countEnd > now), true
}

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
