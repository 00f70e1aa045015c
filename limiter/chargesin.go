package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// Every node's charges in before any node decides on Redis again. After an
// outage the nodes notice that Redis answers a fraction of a second apart,
// and on a busy machine a node can be a second or more behind. A node that
// went back to Redis while another still decided locally would spend the
// Redis bucket's refill while the late node spent its own share again, and
// the late node's charge (at most what its local bucket owes) could not
// take both back. So each node that finds Redis back, once its charges are
// in, adds itself to a sorted set in Redis (chargedKey: its id, scored by
// Redis' clock), and keeps deciding the local zones' keys locally until the set
// holds as many nodes as its local buckets divide by, or returnGraceMax
// has passed. A node whose store failed with nothing to charge adds itself
// too, and so does every node that hears, on the ban channel, that another
// node is charging (chargingMsg) while it has nothing to charge: a node
// that saw no failure (a CLIENT KILL that missed it, an idle node) does not
// hold the others. Only a node that cannot hear the channel (its
// subscription broken by a Redis restart) holds the others, at most
// returnGraceMax, which the bound allows (local buckets hold the fleet
// within it).
//
// The set lives in one Cluster slot, so what the fleet sends it is
// bounded per node, however many nodes charge: a node records itself at
// most once per chargedShared however many of its limiters poll (they
// share the record), and answers the announcements at most once per
// chargedAnswerEvery (its entry still counts through the grace of every
// node that announces meanwhile). With K of N nodes charging, the slot
// gets N−K answers, not K×(N−K), and in all at most one call per node per
// chargedShared, each node for at most returnGraceMax after it came back
// or heard an announcement: for 100 nodes, at most 4,000 short script
// calls a second (the polls stop once the set holds the fleet).

// returnGraceMax is the longest a node that finds Redis back keeps
// deciding the local zones' keys on its local buckets, waiting for the
// other nodes' charges.
const returnGraceMax = 2 * time.Second

// chargedWindow is how long a node's entry in the set of nodes whose
// charges are in counts: longer than returnGraceMax, so that the first
// node back still counts when the last one arrives. An outage that ends
// within it of the previous one finds the previous entries, and ends the
// grace early.
const chargedWindow = 2 * returnGraceMax

// chargingMsg is the ban channel's message that a node is back from an
// outage with charges to make.
const chargingMsg = "!charging"

// chargedPoll is how often a node in its grace counts the nodes whose
// charges are in.
const chargedPoll = 50 * time.Millisecond

// chargedShared is how recently a record of this node in the set must
// have come back for the store's limiters that poll the set to share it:
// under chargedPoll, so that each limiter's poll still reads a count newer
// than its last.
const chargedShared = chargedPoll / 2

// chargedAnswerEvery is the least time between two of a node's answers to
// chargingMsg. An entry counts for chargedWindow from when it was sent, and
// a grace lasts returnGraceMax from before its announcement, so an entry
// sent within chargedAnswerEvery of an announcement counts through its
// grace.
const chargedAnswerEvery = chargedWindow - returnGraceMax

// chargeBarrier is a store shared by the fleet that can count the nodes
// whose charges are in: the Redis store.
type chargeBarrier interface {
	// ChargesIn records that this node's charges are in and returns how
	// many nodes' are, within chargedWindow.
	ChargesIn(ctx context.Context) (int64, error)
}

// newNodeID returns a random id for a store, that tells this node's
// entries in Redis from the other nodes'.
func newNodeID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// chargedKey returns the Redis key of the set of nodes whose charges are
// in. It ends with a character other than a brace, so no bucket's key
// (which ends with its hash tag) can be it.
func (s *RedisStore) chargedKey() string { return s.prefix + "outage:{outage}!charged" }

// chargedScript is the outage barrier's script, loaded on first use.
var chargedScript = redis.NewScript(lua.Charged)

// ChargesIn records, within the store's timeout, that this node's charges
// are in, and returns how many nodes' are (the entries of the last
// chargedWindow): one call of the charged script, which scores the entries
// by Redis TIME, so that a node whose clock is off is counted all the same
// and leaves no entry that outlives the window. (The store's test Clock
// does not reach it either: the barrier is no bucket.) A record that went
// in less than chargedShared ago stands for a new one: its count is
// returned.
func (s *RedisStore) ChargesIn(ctx context.Context) (int64, error) {
	return s.barrier.record(ctx, s, 0, chargedShared)
}

// nodeBarrier is a store's side of the outage barrier: its last record in
// the set of nodes whose charges are in.
type nodeBarrier struct {
	mu sync.Mutex // held across a record: concurrent callers share one
	// sent and done are when the last record that went in was sent and
	// when its reply came (zero: none); n is the count it returned.
	sent, done time.Time
	n          int64
	// answering is set while an answer to chargingMsg is in flight.
	answering atomic.Bool
}

// record records this node in the set and returns the count, unless the
// last record was sent less than sentWithin ago or came back less than
// doneWithin ago: then it returns that record's count.
func (b *nodeBarrier) record(ctx context.Context, s *RedisStore, sentWithin, doneWithin time.Duration) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done.IsZero() && (time.Since(b.sent) < sentWithin || time.Since(b.done) < doneWithin) {
		return b.n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	sent := time.Now()
	n, err := chargedScript.Run(ctx, s.client, []string{s.chargedKey()}, s.id, chargedWindow.Milliseconds()).Int64()
	if err != nil {
		return 0, err
	}
	b.sent, b.done, b.n = sent, time.Now(), n
	return n, nil
}

// awaitFleetCharges is run by a node whose charges are in, in its grace:
// it records them and ends the grace once need nodes' are in, or lets it
// run out.
func (l *Limiter) awaitFleetCharges(need int64) {
	b, ok := l.store.(chargeBarrier)
	if !ok || !l.out.awaiting.CompareAndSwap(false, true) {
		return
	}
	defer l.out.awaiting.Store(false)
	t := time.NewTicker(chargedPoll)
	defer t.Stop()
	for {
		until := l.out.graceUntil.Load()
		if until == 0 || time.Now().UnixNano() >= until {
			return
		}
		if n, err := b.ChargesIn(context.Background()); err == nil && n >= need {
			l.out.graceUntil.CompareAndSwap(until, time.Now().UnixNano()) // returning() ends it
			return
		}
		<-t.C
	}
}

// nothingToCharge records, in the background, that this node (whose store
// came back, with no charges to make) does not hold the others' grace up.
func (l *Limiter) nothingToCharge() {
	if b, ok := l.store.(chargeBarrier); ok {
		go func() { _, _ = b.ChargesIn(context.Background()) }()
	}
}

// owingStore is a store that knows whether any of its limiters has local
// admissions to charge: the Redis store.
type owingStore interface {
	owe(delta int64)
}

// setPending records the ledger's length, and tells the store when the
// limiter starts or stops owing charges. l.out.mu is held.
func (l *Limiter) setPending(n int64) {
	was := l.out.pending.Swap(n)
	s, ok := l.store.(owingStore)
	switch {
	case !ok:
	case was == 0 && n > 0:
		s.owe(1)
	case was > 0 && n == 0:
		s.owe(-1)
	}
}

// announceCharging tells the fleet, in the background, that this node is
// back with charges to make, so that the nodes with none add themselves to
// the set at once.
func (l *Limiter) announceCharging() {
	if s, ok := l.store.(*RedisStore); ok {
		s.bans.publish(chargingMsg)
	}
}

// owe counts the store's limiters that have local admissions to charge.
func (s *RedisStore) owe(delta int64) { s.owing.Add(delta) }

// chargingAnnounced is called when a node announces it is charging: this
// node, if none of its limiters has anything to charge, adds itself to the
// set of nodes whose charges are in, in the background, unless its entry
// there is less than chargedAnswerEvery old or an answer is in flight. An
// answer that fails is tried again every chargedPoll while it can still
// shorten the grace (returnGraceMax).
func (s *RedisStore) chargingAnnounced() {
	if s.owing.Load() > 0 || !s.barrier.answering.CompareAndSwap(false, true) {
		return
	}
	heard := time.Now()
	go func() {
		defer s.barrier.answering.Store(false)
		for {
			_, err := s.barrier.record(context.Background(), s, chargedAnswerEvery, 0)
			if err == nil || time.Since(heard) >= returnGraceMax || !sleepOrStop(chargedPoll, s.stop) {
				return
			}
		}
	}()
}
