package limiter

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis store's pub/sub channel (the ban channel): bans started and
// lifted, keys reset, a breaker closed and an outage's charges, heard by every
// node.

const (
	// banPing is how long the subscriber waits for a message before it
	// pings, and then for the reply before it starts over on a new
	// connection: a connection that died without a word is noticed.
	banPing = 30 * time.Second
	// banRetryMax is the longest pause between two attempts to subscribe
	// while Redis is away: short, because a subscription that comes back
	// also ends the breaker's open state (breakerClosedMsg), and an attempt
	// on a server that is down costs a refused dial.
	banRetryMax = 200 * time.Millisecond
	// banRefusedRetry is how long the subscriber waits before it tries
	// again when Redis refuses it the channel (an ACL without it).
	banRefusedRetry = time.Minute
)

// banChannel returns the store's ban channel.
func (s *RedisStore) banChannel() string { return s.prefix + "bans" }

// banListener is a store's subscriber to its ban channel.
type banListener struct {
	mu     sync.Mutex
	ps     *redis.PubSub
	closed bool
}

// use makes ps the subscriber's connection, closing the one before; it
// reports false (and closes ps) once the subscriber is closed.
func (l *banListener) use(ps *redis.PubSub) bool {
	l.mu.Lock()
	old, closed := l.ps, l.closed
	if !closed {
		l.ps = ps
	}
	l.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	if closed {
		_ = ps.Close()
	}
	return !closed
}

// close closes the subscriber's connection and stops it.
func (l *banListener) close() {
	l.mu.Lock()
	ps := l.ps
	l.closed = true
	l.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
}

// isClosed reports whether the subscriber was closed.
func (l *banListener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// subscribe opens a new subscription to the ban channel (connecting, and
// retrying later, in the background).
func (l *banListener) subscribe(ctx context.Context, b *redisBans) (*redis.PubSub, bool) {
	ps := b.s.client.Subscribe(ctx)
	if !l.use(ps) {
		return nil, false
	}
	_ = ps.Subscribe(ctx, b.s.banChannel()) // a failure shows in the receive
	return ps, true
}

// run receives the ban channel's messages until the store closes.
func (l *banListener) run(b *redisBans) {
	ctx := b.ctx
	stop := ctx.Done()
	closed := make(chan struct{})
	go func() { // closing the connection ends a receive that waits
		defer close(closed)
		<-stop
		l.close()
	}()
	defer func() { <-closed }()
	ps, ok := l.subscribe(ctx, b)
	if !ok {
		return
	}
	var (
		pause    time.Duration
		pinged   bool
		failedAt time.Time // when the subscription last failed; zero while it holds
	)
	for {
		msg, err := ps.ReceiveTimeout(ctx, banPing)
		if l.isClosed() {
			return
		}
		switch {
		case err == nil:
			pinged = false
			switch m := msg.(type) {
			case *redis.Subscription:
				pause = 0
				if !failedAt.IsZero() {
					b.s.breaker.Close() // Redis answers again (breakerClosedMsg)
					b.catchUp(failedAt)
					failedAt = time.Time{}
				}
			case *redis.Message:
				b.message(m.Payload)
			}
			continue
		case isTimeout(err) && !pinged:
			pinged = true
			_ = ps.Ping(ctx)
			continue
		case isTimeout(err):
			// Neither a message nor the ping's reply: the connection
			// died without a word. Start over on a new one.
			pinged = false
			if failedAt.IsZero() {
				failedAt = time.Now().Add(-2 * banPing)
			}
			if ps, ok = l.subscribe(ctx, b); !ok {
				return
			}
			continue
		}
		if failedAt.IsZero() {
			failedAt = time.Now()
		}
		if _, refused := noPermCommand(err); refused {
			b.warn("redis refuses the ban channel to this user: a ban lifted on another node stays in this node's deny cache until it ends", err)
			if !sleepOrStop(banRefusedRetry, stop) {
				return
			}
			_ = ps.Subscribe(ctx, b.s.banChannel())
			continue
		}
		// Redis is away: go-redis dials again on the next receive.
		pause = min(max(2*pause, 100*time.Millisecond), banRetryMax)
		if !sleepOrStop(pause, stop) {
			return
		}
	}
}

// isTimeout reports whether err is a read that timed out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// sleepOrStop waits d, and reports false if stop was closed meanwhile.
func sleepOrStop(d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

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
// a ban started, or a key was reset (resetPrefix). Every message but the
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
		b.s.chargingAnnounced()
	case strings.HasPrefix(msg, banStartPrefix):
		b.started(msg)
	case strings.HasPrefix(msg, resetPrefix):
		b.reset(msg)
	}
}
