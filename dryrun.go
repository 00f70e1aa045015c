package fleetlimit

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// dryRunMessage is the log line of a request that a dry-run zone would
// have denied.
const dryRunMessage = "rate limit dry run: would deny"

// provisionDryRun sets up the log of dry-run zones' would-be denials: at
// info level, at most one line per key and zone a second (and a bounded
// number of lines a second in all, like log_denials info).
func (h *Handler) provisionDryRun() {
	h.dryRunLog = nil
	for _, z := range h.Zones {
		if z.DryRun || h.DryRun {
			h.dryRunLog = newDenialThrottle()
			return
		}
	}
}

// logDryRuns logs the dry-run zones that would have denied a request.
func (h *Handler) logDryRuns(r *http.Request, ds []zoneDecision) {
	t := h.dryRunLog
	if t == nil {
		return
	}
	for i := range ds {
		d, res := &ds[i], &ds[i].res
		if !res.DryRun {
			continue
		}
		ce := h.logger.Check(zap.InfoLevel, dryRunMessage)
		if ce == nil {
			return
		}
		ok, dropped := t.admit(d.zone.Name, d.req.Key, h.now().Unix())
		if dropped > 0 {
			h.logger.Info("rate limit dry-run lines left out of the log", zap.Int64("count", dropped))
		}
		if !ok {
			continue
		}
		fields := []zap.Field{zap.String("zone", d.zone.Name), zap.String("remote_ip", remoteIP(r)),
			h.keyField(d.req.Key), zap.Int64("cost", d.req.Cost), zap.Bool("banned", res.Banned)}
		if res.RetryAfter != limiter.Never {
			fields = append(fields, zap.Duration("retry_after", res.RetryAfter))
		}
		if res.BanStarted {
			fields = append(fields, zap.Bool("ban_started", true))
		}
		ce.Write(fields...)
	}
}
