package fleetlimit

import (
	"fmt"
	"hash/maphash"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The handler's log lines about its decisions: denials (log_denials), dry
// runs' would-be denials and bans started, each throttled per key and zone
// where a flood could flood the log.

// deniedMessage is the message of a denial's log line, caddy-ratelimit's.
const deniedMessage = "rate limit exceeded"

// dryRunMessage is the log line of a request that a dry-run zone would
// have denied.
const dryRunMessage = "rate limit dry run: would deny"

// denialLevel is how denials are logged (Handler.LogDenials).
type denialLevel uint8

const (
	denialsDebug denialLevel = iota // every denial, at debug level
	denialsInfo                     // at info level, throttled
	denialsOff                      // not at all
)

// parseDenialLevel reads log_denials; empty is the default, debug.
func parseDenialLevel(s string) (denialLevel, error) {
	switch s {
	case "", "debug":
		return denialsDebug, nil
	case "info":
		return denialsInfo, nil
	case "off":
		return denialsOff, nil
	}
	return 0, fmt.Errorf("unknown log_denials %q (want info, debug or off)", s)
}

// denialLog is how the log lines of denials are written.
type denialLog struct {
	level    denialLevel
	throttle *denialThrottle // with info
}

// provisionDenials sets up the denial log from LogDenials.
func (h *Handler) provisionDenials() error {
	level, err := parseDenialLevel(h.LogDenials)
	if err != nil {
		return err
	}
	if level == denialsDebug && !h.logger.Core().Enabled(zapcore.DebugLevel) {
		// A logger's level is fixed for the life of a config (a reload
		// provisions the handler again): a denial need not ask it.
		level = denialsOff
	}
	h.denials = denialLog{level: level}
	if level == denialsInfo {
		h.denials.throttle = newDenialThrottle()
	}
	if h.now == nil {
		h.now = time.Now
	}
	return nil
}

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

// logDecisions writes the log lines of a request's decisions, in one pass
// over its zones: a dry-run zone's would-be denial, a ban that the
// request's denial started, and, when den names the zone that answers a
// denial, each denying zone's line.
func (h *Handler) logDecisions(r *http.Request, ds []zoneDecision, den denier) {
	for i := range ds {
		d := &ds[i]
		switch {
		case d.res.DryRun: // its would-be ban is on its line
			h.logDryRun(r, d)
		case d.res.BanStarted:
			h.logBanStart(r, d)
		}
		if den.zone != nil && !d.res.Allowed { // Unknown results are Allowed too
			h.logDenial(r, d, den.retry)
		}
	}
}

// logDenial writes a denying zone's line, as log_denials says: wait is
// the wait Retry-After gives (jitter included), as caddy-ratelimit logged
// it, and the zone's own wait is its retry_after.
func (h *Handler) logDenial(r *http.Request, d *zoneDecision, wait time.Duration) {
	lvl := zapcore.DebugLevel
	switch h.denials.level {
	case denialsOff:
		return
	case denialsInfo:
		lvl = zapcore.InfoLevel
	}
	ce := h.logger.Check(lvl, deniedMessage)
	if ce == nil {
		return
	}
	if t := h.denials.throttle; t != nil {
		ok, dropped := t.admit(d.zone.Name, d.req.Key, h.now().Unix())
		if dropped > 0 {
			h.logger.Info("rate limit denials left out of the log",
				zap.Int64("count", dropped), zap.Int("max_lines_per_second", denialShards*denialShardKeys))
		}
		if !ok {
			return
		}
	}
	ce.Write(zap.String("zone", d.zone.Name), zap.Duration("wait", wait), zap.String("remote_ip", remoteIP(r)),
		h.keyField(d.req.Key), zap.Int64("cost", d.req.Cost), zap.Duration("retry_after", d.res.RetryAfter))
}

// logDryRun writes the line of a request that a dry-run zone would have
// denied: at info, at most one line per key and zone a second.
func (h *Handler) logDryRun(r *http.Request, d *zoneDecision) {
	t, res := h.dryRunLog, &d.res
	if t == nil {
		return
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
		return
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

// logBanStart writes, at info, the line of a ban that a request's denial
// started in a zone.
func (h *Handler) logBanStart(r *http.Request, d *zoneDecision) {
	if ce := h.logger.Check(zap.InfoLevel, "rate limit ban started"); ce != nil {
		ban := d.req.Rule.Ban()
		ce.Write(zap.String("zone", d.zone.Name), h.keyField(d.req.Key), zap.String("remote_ip", remoteIP(r)),
			zap.Duration("duration", ban.Duration), zap.Int64("after", ban.After), zap.Duration("window", ban.Window))
	}
}

// keyField is a client key as logs carry it: its digest, or with log_key
// the key itself.
func (h *Handler) keyField(key string) zap.Field {
	if h.LogKey {
		return zap.String("key", key)
	}
	return zap.String("key_digest", h.digest.Digest(key))
}

// remoteIP is the address of the connection's peer, as caddy-ratelimit
// logged it.
func remoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// The denial throttle's bounds: it remembers at most denialShardKeys keys
// per shard and second, so at most denialShards x denialShardKeys lines a
// second, however many keys a flood brings.
const (
	denialShards    = 16
	denialShardKeys = 64
)

// denialThrottle lets a key's denial in a zone be logged at most once a
// second. Each shard remembers the digests of the keys it logged in the
// current second and forgets them when the next second begins; a shard
// that is full logs no more keys until then (they are counted, and the
// count logged once in a later second), so its memory and the log's lines
// stay bounded whatever a flood of keys does.
type denialThrottle struct {
	seed     maphash.Seed
	shards   [denialShards]denialShard
	dropped  atomic.Int64 // lines left out because a shard was full
	reported atomic.Int64 // the second in which dropped was last reported
}

// denialShard is one shard of the throttle.
type denialShard struct {
	mu   sync.Mutex
	sec  int64               // the second seen holds
	seen map[uint64]struct{} // digests of (zone, key) logged in sec
	_    [40]byte            // keeps shards on their own cache lines
}

func newDenialThrottle() *denialThrottle {
	t := &denialThrottle{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].seen = make(map[uint64]struct{}, denialShardKeys)
	}
	return t
}

// admit reports whether a denial of key in the named zone in second sec is
// logged, and how many lines full shards left out before this
// second, once a second, when there were any.
func (t *denialThrottle) admit(zone, key string, sec int64) (bool, int64) {
	var dropped int64
	if prev := t.reported.Load(); sec > prev && t.reported.CompareAndSwap(prev, sec) {
		dropped = t.dropped.Swap(0)
	}
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(zone)
	h.WriteByte(0) // zone names have no NUL: (zone, key) pairs stay apart
	h.WriteString(key)
	d := h.Sum64()
	s := &t.shards[d%denialShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sec != sec {
		clear(s.seen)
		s.sec = sec
	}
	if _, ok := s.seen[d]; ok {
		return false, dropped
	}
	if len(s.seen) >= denialShardKeys {
		t.dropped.Add(1)
		return false, dropped
	}
	s.seen[d] = struct{}{}
	return true, dropped
}

// size returns how many keys the throttle remembers.
func (t *denialThrottle) size() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += len(s.seen)
		s.mu.Unlock()
	}
	return n
}
