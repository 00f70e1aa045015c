package limiter

// Bans in the memory store: per bucket, the denials counted in the current
// ban window and the ban itself, beside the bucket (lua/decide.lua keeps
// the same in <bucket>!den and <bucket>!ban).

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
