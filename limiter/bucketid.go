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
//
// The low 32 bits of the second half are the zone's tag instead (see tag),
// so that a bucket's zone can be told from its id alone: 96 bits of hash
// still tell buckets apart.
func (h hasher) id(zone, key string) bucketID {
	var id bucketID
	z0, z1 := maphash.String(h.seeds[0], zone), maphash.String(h.seeds[1], zone)
	id[0] = z0*0x9E3779B97F4A7C15 ^ maphash.String(h.seeds[0], key)
	id[1] = (z1*0x9E3779B97F4A7C15^maphash.String(h.seeds[1], key))&^0xFFFFFFFF | uint64(uint32(z0))
	if id == (bucketID{}) {
		id[0] = 1 // the zero id marks an empty slot of a bucketTable
	}
	return id
}

// zone returns the tag of the bucket's zone (see hasher.tag).
func (id bucketID) zone() uint32 { return uint32(id[1]) }

// tag returns a 32-bit keyed hash of a zone's bucket name, which bucket
// ids carry so that evictions can be counted per zone without a pointer or
// another field in the maps.
func (h hasher) tag(zone string) uint32 {
	return uint32(maphash.String(h.seeds[0], zone))
}
