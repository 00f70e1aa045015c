package fleetlimit

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
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

// hdrDelay reports how long a leaky bucket held the request, in
// milliseconds.
const hdrDelay = "X-Ratelimit-Delay"

// errClientGone ends a request whose client left while it waited for its
// turn in a leaky bucket.
var errClientGone = errors.New("client went away while waiting for its turn")

// wait holds an admitted request for its turn when a leaky bucket zone
// delayed it, and releases it early if the client goes away.
func (h *Handler) wait(w http.ResponseWriter, r *http.Request, zones []*Zone, results []limiter.Result) error {
	var delay time.Duration
	var zone *Zone
	for i := range results {
		if results[i].Delay > delay {
			delay, zone = results[i].Delay, zones[i]
		}
	}
	if delay <= 0 {
		return nil
	}
	w.Header()[hdrDelay] = []string{strconv.FormatInt(int64((delay+time.Millisecond-1)/time.Millisecond), 10)}
	if ce := h.logger.Check(zap.DebugLevel, "rate limit delayed request"); ce != nil {
		ce.Write(zap.String("zone", zone.Name), zap.Duration("delay", delay))
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.Context().Done():
		return caddyhttp.Error(499, errClientGone)
	}
}
