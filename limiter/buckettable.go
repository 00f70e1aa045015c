package limiter

import "math/rand/v2"

// bucketTable holds a shard's buckets: an open-addressing hash table of
// bucket ids (linear probing, deletion by backward shift, no tombstones)
// whose slots hold each bucket inline, two to a cache line. With many keys
// a decision's bucket is rarely in the CPU's caches (the rest of the
// server's work between two decisions evicts it): finding it here costs
// one or two cache lines where a Go map reads its directory, table, group
// control word and slot, each a miss of its own.
//
// The table is at most three quarters full, so a search always ends at
// an empty slot. The zero bucketID marks an empty slot: hasher.id never
// returns it.
type bucketTable struct {
	slots []bucketSlot // len a power of two (or 0)
	n     int          // occupied slots
}

// bucketSlot is one slot of a bucketTable.
type bucketSlot struct {
	id bucketID
	e  memEntry
}

// minTableSlots is the smallest table allocated.
const minTableSlots = 16

// home is the slot where a bucket's search starts. The shard index takes
// the id's low bits; the slot takes bits above them.
func (t *bucketTable) home(id bucketID) int {
	return int((id[0] >> 8) & uint64(len(t.slots)-1))
}

// find returns the index of the slot holding id and true, or of the empty
// slot where id would go and false (-1 if the table has no slots).
func (t *bucketTable) find(id bucketID) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	mask := len(t.slots) - 1
	for i := t.home(id); ; i = (i + 1) & mask {
		switch t.slots[i].id {
		case id:
			return i, true
		case bucketID{}:
			return i, false
		}
	}
}

// get returns the bucket of id, if the table holds it.
func (t *bucketTable) get(id bucketID) (memEntry, bool) {
	if i, ok := t.find(id); ok {
		return t.slots[i].e, true
	}
	return memEntry{}, false
}

// has reports whether the table holds the bucket of id.
func (t *bucketTable) has(id bucketID) bool {
	_, ok := t.find(id)
	return ok
}

// put sets the bucket of id, adding it if the table does not hold it.
func (t *bucketTable) put(id bucketID, e memEntry) {
	i, ok := t.find(id)
	if ok {
		t.slots[i].e = e
		return
	}
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(minTableSlots, 2*len(t.slots)))
		i, _ = t.find(id)
	}
	t.slots[i] = bucketSlot{id: id, e: e}
	t.n++
}

// remove drops the bucket of id, if the table holds it.
func (t *bucketTable) remove(id bucketID) {
	if i, ok := t.find(id); ok {
		t.removeAt(i)
	}
}

// removeAt empties slot i and moves back the buckets after it whose
// search would otherwise cross the hole, so that every bucket stays
// reachable from its home slot without tombstones.
func (t *bucketTable) removeAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].id != (bucketID{}); j = (j + 1) & mask {
		// The bucket at j may move to i unless its home lies cyclically
		// in (i, j]: then its search never passes i.
		k := t.home(t.slots[j].id)
		if i <= j && i < k && k <= j || i > j && (i < k || k <= j) {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = bucketSlot{}
	t.n--
}

// resize moves the buckets to a table of size slots (a power of two that
// holds them).
func (t *bucketTable) resize(size int) {
	old := t.slots
	t.slots = make([]bucketSlot, size)
	for i := range old {
		if old[i].id != (bucketID{}) {
			j, _ := t.find(old[i].id)
			t.slots[j] = old[i]
		}
	}
}

// sample returns, among up to n buckets read from a random slot on, the
// one that expires first, or false for an empty table. It stops early at
// a bucket that expired at now.
func (t *bucketTable) sample(n int, now int64) (bucketID, int64, bool) {
	if t.n == 0 {
		return bucketID{}, 0, false
	}
	mask := len(t.slots) - 1
	var victim bucketID
	best, seen := int64(0), 0
	for i := rand.IntN(len(t.slots)); seen < n && seen < t.n; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.id == (bucketID{}) {
			continue
		}
		if seen == 0 || s.e.expires < best {
			victim, best = s.id, s.e.expires
		}
		if seen++; best <= now {
			break
		}
	}
	return victim, best, true
}

// sweep drops the buckets that expired at now, and returns the memory of a
// table that the drop left less than an eighth full.
func (t *bucketTable) sweep(now int64) {
	for i := 0; i < len(t.slots); {
		if s := &t.slots[i]; s.id != (bucketID{}) && s.e.expires <= now {
			t.removeAt(i) // a later bucket may move to i: look at i again
			continue
		}
		i++
	}
	if len(t.slots) > minTableSlots && t.n*8 < len(t.slots) {
		size := minTableSlots
		for size*3 < t.n*8 { // at most three eighths full after it
			size *= 2
		}
		t.resize(size)
	}
}
