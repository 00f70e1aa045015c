package limiter

import (
	"context"
	"strings"
	"time"
)

// The breaker closes everywhere at once. After an outage each node's
// circuit breaker probes Redis once per cooldown, so the nodes would go
// back to Redis up to a cooldown apart, some deciding on their local
// buckets while the others decide on Redis. So the first node whose call
// finds Redis answering again (its breaker closes) publishes
// breakerClosedMsg on the store's ban channel (redisunban.go), and every
// node that receives it closes its breaker at once. A node whose
// subscription broke (Redis restarted, or failed over) subscribes again
// within banRetryMax of Redis answering, and closes its breaker then.
// Either way a node stays local at most a cooldown (BreakerCooldown, 1s by
// default) once Redis answers, and mostly a fraction of a second.

// breakerClosedMsg is the ban channel's message that a node found Redis
// answering.
const breakerClosedMsg = "!breaker-closed"

// breakerClosed publishes, in the background, that this node's breaker
// closed.
func (b *redisBans) breakerClosed() { b.publish(breakerClosedMsg) }

// publish publishes msg on the ban channel, in the background.
func (b *redisBans) publish(msg string) {
	go func() {
		ctx, cancel := context.WithTimeout(b.ctx, time.Second)
		defer cancel()
		_ = b.s.client.Publish(ctx, b.s.banChannel(), msg).Err()
	}()
}

// message handles a message of the ban channel: a ban was lifted
// (liftMsg), a node's breaker closed, a node is charging after an outage,
// a ban started, or a key was reset (rediskeys.go). Every message but the
// lift of a key that does not start with "!" starts with "!" and its type;
// one of a type this node does not know is ignored.
func (b *redisBans) message(msg string) {
	if key, bucket, ok := parseLift(msg); ok {
		b.lifted(key, bucket)
		return
	}
	switch {
	case msg == breakerClosedMsg:
		b.s.breaker.Close()
	case msg == chargingMsg:
		b.s.chargingAnnounced() // chargesin.go
	case strings.HasPrefix(msg, banStartPrefix):
		b.started(msg)
	case strings.HasPrefix(msg, resetPrefix):
		b.reset(msg)
	}
}
