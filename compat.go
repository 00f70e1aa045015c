package fleetlimit

// What is here only for mholt/caddy-ratelimit's sake: its options that
// fleetlimit accepts so that that plugin's Caddyfiles load unchanged (the
// Caddyfile forms are in caddyfile.go, the window and events form of a
// limit in algorithm.go).

import (
	"errors"
	"math/rand/v2"
	"time"
)

// provisionCompat checks caddy-ratelimit's options and warns about those
// that fleetlimit accepts only so that that plugin's configurations load.
func (h *Handler) provisionCompat() error {
	if h.Jitter < 0 || h.Jitter > 100 {
		return errors.New("rate_limit: jitter must be between 0 and 100 (percent) or 0 and 1 (a share)")
	}
	if h.SweepInterval < 0 {
		return errors.New("rate_limit: sweep_interval must not be negative")
	}
	if h.Distributed != nil {
		h.logger.Warn("rate_limit: the 'distributed' block of caddy-ratelimit is accepted and ignored: " +
			"fleetlimit shares every bucket through Redis, exactly, with no read or write intervals; add a redis block to share limits across nodes")
	}
	if len(h.Storage) > 0 {
		h.logger.Warn("rate_limit: 'storage' (caddy-ratelimit's distributed state) is accepted and ignored: " +
			"fleetlimit keeps shared buckets in Redis; configure the redis block instead")
	}
	return nil
}

// jitter adds up to the handler's Jitter share of retry, at random.
func (h *Handler) jitter(retry time.Duration) time.Duration {
	share := h.Jitter
	if share > 1 {
		share /= 100
	}
	if share <= 0 || retry <= 0 {
		return retry
	}
	return retry + time.Duration(rand.Float64()*share*float64(retry))
}
