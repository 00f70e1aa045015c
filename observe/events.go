package observe

import (
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The Caddy events of the policies, besides rate_limit_exceeded.
const (
	// dryRunEvent is emitted when a dry-run zone would have denied a
	// request (which passed).
	dryRunEvent = "rate_limit_dry_run"
	// bannedEvent is emitted when a zone's denial starts a key's ban (in
	// a dry run: would have started one; dry_run is then true).
	bannedEvent = "rate_limit_banned"
)

// emitPolicyEvent emits a dry-run or ban event of a zone. Its data: zone,
// key_digest (and key, only with log_key), cost, dry_run, and
// retry_after (whole seconds, rounded up; for a ban, its duration; absent
// when no wait helps).
func (h *Handler) emitPolicyEvent(name string, z *Zone, req *limiter.Request, res *limiter.Result) {
	data := map[string]any{
		"zone":       z.name,
		"key_digest": h.digest.Digest(req.Key),
		"cost":       req.Cost,
		"dry_run":    res.DryRun,
	}
	if h.logKey {
		data["key"] = req.Key
	}
	if res.RetryAfter != limiter.Never {
		data["retry_after"] = retryAfterSeconds(res.RetryAfter)
	}
	if name == bannedEvent {
		if ban := req.Rule.Ban(); ban.Duration > 0 {
			data["ban_seconds"] = retryAfterSeconds(ban.Duration)
		}
	}
	h.events.Emit(h.ctx, name, data)
}
