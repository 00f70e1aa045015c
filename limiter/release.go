package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
)

// What happens after a request: the refund of a charge that a zone does
// not count after all (count_status), and the release of a concurrency
// zone's slot.

// slotNamer names the concurrency slots of one limiter: a random prefix,
// so that no two nodes (or two configurations of one node) name a slot
// alike, and a counter.
type slotNamer struct {
	prefix atomic.Pointer[string]
	n      atomic.Uint64
}

// next returns a new slot id.
func (s *slotNamer) next() string {
	p := s.prefix.Load()
	if p == nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		v := hex.EncodeToString(b[:]) + ":"
		s.prefix.CompareAndSwap(nil, &v)
		p = s.prefix.Load()
	}
	var buf [48]byte
	return string(strconv.AppendUint(append(buf[:0], *p...), s.n.Add(1), 36))
}

// Refund gives back what the decision of outcome charged the zones of
// reqs, with the results Decide returned for them: pass the zones whose
// charge is to be given back (a response that a count_status zone does
// not count) and the concurrency zones, whose slots their request holds
// until this call. Decisions that charged nothing (denied, failed open or
// closed) need none. A decision made on the local fallback buckets is
// refunded there. When the store fails, the refund is dropped (the charge
// stays: strict, never lenient; a slot then ends with its lease) and
// counted (see Refunds).
func (l *Limiter) Refund(ctx context.Context, outcome Outcome, reqs []Request, results []Result) error {
	if len(reqs) == 0 {
		return nil
	}
	l.refunds.Add(1)
	var err error
	switch outcome {
	case Allowed:
		err = l.store.Refund(ctx, reqs, results)
	case LocalAllowed:
		err = l.refundLocal(ctx, reqs, results)
	default:
		return nil
	}
	if err != nil {
		l.refundsLost.Add(1)
	}
	if l.obs != nil {
		for i := range reqs {
			l.obs.Refunded(reqs[i].Rule, err)
		}
	}
	return err
}

// refundLocal refunds, on this node's fallback buckets, a decision made
// there.
func (l *Limiter) refundLocal(ctx context.Context, reqs []Request, results []Result) error {
	if l.local == nil {
		return nil
	}
	view := int64(1)
	if l.fleet != nil {
		view = l.fleet()
	}
	lreqs := make([]Request, 0, len(reqs))
	lres := make([]Result, 0, len(reqs))
	for i := range reqs {
		if r := reqs[i].Rule; r.onError == PolicyLocal && r.local != nil && !results[i].Unknown {
			local, _ := r.localFor(view)
			q := reqs[i]
			q.Rule = local
			lreqs, lres = append(lreqs, q), append(lres, results[i])
		}
	}
	return l.local.Refund(ctx, lreqs, lres)
}

// Refunds returns how many refunds were asked for, and how many of them
// the store failed (dropped).
func (l *Limiter) Refunds() (asked, lost uint64) {
	return l.refunds.Load(), l.refundsLost.Load()
}
