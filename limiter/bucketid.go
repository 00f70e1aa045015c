package limiter

import "hash/maphash"

// bucketID names a bucket in this process's maps: 128 bits of a keyed hash
// of the zone name and client key. Keys without pointers keep the garbage
// collector away from the maps; the seeds are random per process, so
// clients cannot aim for a collision, and 128 bits make an accidental one
// negligible.
type bucketID [2]uint64

// shard returns the index of the shard that holds the bucket.
func (id bucketID) shard() uint8 { return uint8(id[0] % numShards) }

// hasher turns zone names and client keys into bucket ids.
type hasher struct{ seeds [2]maphash.Seed }

func newHasher() hasher {
	return hasher{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
}

// id hashes a zone name and client key into a bucket id without allocating:
// per half, a keyed hash of each string (maphash.String, no buffering), the
// zone's multiplied by an odd constant before they are combined, so that
// (zone, key) pairs map to distinct ids as a 128-bit random function would.
func (h hasher) id(zone, key string) bucketID {
	var id bucketID
	for i := range id {
		id[i] = maphash.String(h.seeds[i], zone)*0x9E3779B97F4A7C15 ^ maphash.String(h.seeds[i], key)
	}
	return id
}
