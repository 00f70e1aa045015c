package fleetlimit

import (
	"hash/maphash"
	"sync/atomic"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The tier that applied last to a key, for the admin API's key lookup
// (GET /rate_limit/keys): a zone whose rate or burst comes from
// placeholders has a rule per tier, and its bucket does not say which one
// charged it. Each node remembers it, lossily, in a fixed table: a slot per
// hash of the key holds the key's hash and the tier's number, one atomic
// store per request of such a zone, nothing allocated. A key whose slot a
// later key took is unknown; so is a key this node did not decide.

// lastTierSlots is how many keys the table remembers at most.
const lastTierSlots = 4096

// tierBits is how many low bits of a slot hold the tier's number.
const tierBits = 16

// lastTiers is one zone's table.
type lastTiers struct {
	seed  maphash.Seed
	slots [lastTierSlots]atomic.Uint64
}

// newLastTiers returns an empty table.
func newLastTiers() *lastTiers { return &lastTiers{seed: maphash.MakeSeed()} }

// note records that tier applied to key. Slot 0 means empty: a hash whose
// high bits are all zero is not remembered.
func (t *lastTiers) note(key string, tier uint16) {
	h := maphash.String(t.seed, key)
	t.slots[h%lastTierSlots].Store(h&^(1<<tierBits-1) | uint64(tier))
}

// last returns the number of the tier that applied last to key, and false
// when the table does not know.
func (t *lastTiers) last(key string) (uint16, bool) {
	h := maphash.String(t.seed, key)
	v := t.slots[h%lastTierSlots].Load()
	if v == 0 || v&^(1<<tierBits-1) != h&^(1<<tierBits-1) {
		return 0, false
	}
	return uint16(v), true
}

// lastRule returns the rule that applied last to key on this node, or nil
// when it is unknown: the zone's own rule for a zone without tiers.
func (z *Zone) lastRule(key string) *limiter.Rule {
	if z.rules == nil {
		return z.rule
	}
	id, ok := z.lastTier.last(key)
	if !ok {
		return nil
	}
	return z.rules.byTier(id)
}
