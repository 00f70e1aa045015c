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

// id hashes a zone name and client key into a bucket id without allocating.
func (h hasher) id(zone, key string) bucketID {
	var id bucketID
	for i := range id {
		var mh maphash.Hash
		mh.SetSeed(h.seeds[i])
		mh.WriteString(zone)
		mh.WriteByte(0)
		mh.WriteString(key)
		id[i] = mh.Sum64()
	}
	return id
}
