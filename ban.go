package fleetlimit

import (
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// ZoneBan is a zone's ban of repeat offenders: `ban <duration> after <n> in
// <window>`.
type ZoneBan struct {
	// Duration is how long a ban lasts: whole milliseconds. Required.
	Duration caddy.Duration `json:"duration,omitempty"`
	// After is how many denials by the zone within Window start a ban.
	// Required.
	After int64 `json:"after,omitempty"`
	// Window is the time in which After denials start a ban: whole
	// milliseconds. Required.
	Window caddy.Duration `json:"window,omitempty"`
}

// limiterBan returns the ban as the limiter takes it (zero: none).
func (b *ZoneBan) limiterBan() limiter.Ban {
	if b == nil {
		return limiter.Ban{}
	}
	return limiter.Ban{Duration: time.Duration(b.Duration), After: b.After, Window: time.Duration(b.Window)}
}

// validate checks the ban.
func (b *ZoneBan) validate() error {
	ms := caddy.Duration(time.Millisecond)
	switch {
	case b.Duration < ms || b.Duration%ms != 0:
		return errors.New("ban duration must be a positive whole number of milliseconds")
	case b.After < 1:
		return errors.New("ban needs a positive number of denials: ban <duration> after <n> in <window>")
	case b.Window < ms || b.Window%ms != 0:
		return errors.New("ban window must be a positive whole number of milliseconds")
	}
	return nil
}

// unmarshalBan sets up `ban <duration> after <n> in <window>`.
func (z *Zone) unmarshalBan(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) != 5 || args[1] != "after" || args[3] != "in" {
		return d.Errf("zone %q: ban takes: ban <duration> after <n> in <window>", z.Name)
	}
	dur, err := positiveDuration("ban duration", args[0])
	if err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	n, err := positiveInt("ban denials", args[2], 32)
	if err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	win, err := positiveDuration("ban window", args[4])
	if err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	z.Ban = &ZoneBan{Duration: dur, After: n, Window: win}
	if err := z.Ban.validate(); err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	return nil
}

// logBanStarts logs, at info, each ban that a request's denial started (a
// dry run's would-be ban is logged with its would-be denial).
func (h *Handler) logBanStarts(r *http.Request, ds []zoneDecision) {
	for i := range ds {
		d := &ds[i]
		if !d.res.BanStarted || d.res.DryRun {
			continue
		}
		if ce := h.logger.Check(zap.InfoLevel, "rate limit ban started"); ce != nil {
			ban := d.req.Rule.Ban()
			ce.Write(zap.String("zone", d.zone.Name), h.keyField(d.req.Key), zap.String("remote_ip", remoteIP(r)),
				zap.Duration("duration", ban.Duration), zap.Int64("after", ban.After), zap.Duration("window", ban.Window))
		}
	}
}
