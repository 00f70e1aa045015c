package limiter

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// The store's start-up: its first connection and script load, made in the
// background, and the decisions that arrive before they are done.

// warm connects, checks the credentials and loads the scripts, so that the
// first decisions do not pay for a dial, a TLS handshake, AUTH, a Sentinel
// or Cluster lookup and a NOSCRIPT round trip; it gives up after timeout,
// or when the store closes. A failure leaves nothing broken: the decisions
// dial and load again. It records its outcome and closes warmed when done.
func (s *RedisStore) warm(timeout time.Duration) {
	defer close(s.warmed)
	defer func() { s.warmedAt.Store(s.stall.mark().at) }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s.cancelOnClose(ctx, cancel)
	err := checkCredentials(ctx, s.client)
	if errors.Is(err, ErrRedisCredentials) {
		s.log.Error("redis refuses the rate limit store's credentials; every decision fails and takes its zone's on_error policy",
			zap.Error(err))
	}
	pipe := s.client.Pipeline()
	pipe.ScriptLoad(ctx, lua.Decide)
	pipe.ScriptLoad(ctx, lua.Refund)
	_, _ = pipe.Exec(ctx)
	err = orErr(err, s.script.Load(ctx, s.client).Err())
	s.warmErr = orErr(err, s.refund.Load(ctx, s.client).Err())
}

// WaitWarm waits until the store's start-up connection attempt has ended,
// or ctx has, and returns nil when the store connected and loaded its
// scripts; the attempt's failure when Redis was unreachable, refused the
// credentials or did not answer within DialTimeout + Timeout (the
// attempt's bound); or ctx's error. A caller that serves only once it
// returns (Caddy provisioning its handlers) has its first requests decided
// by Redis, not by their failure policy, whenever Redis answers at
// start-up.
func (s *RedisStore) WaitWarm(ctx context.Context) error {
	select {
	case <-s.warmed:
		return s.warmErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// beganWarming reports whether a decision that began at start began before
// the start-up connection attempt ended. Such a decision waits for Redis up
// to MaxWait in wall time, not Timeout (see extension): its round trip may
// carry the first dial and script load, which on a loaded machine take
// longer than a timeout sized for a round trip.
func (s *RedisStore) beganWarming(start stallMark) bool {
	return start.at < s.warmedAt.Load()
}
