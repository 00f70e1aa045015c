package fleetlimit

import (
	"fmt"
	"hash/maphash"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// deniedMessage is the message of a denial's log line, caddy-ratelimit's.
const deniedMessage = "rate limit exceeded"

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

// denialLog writes the log lines of denials, and knows how a denial is
// answered.
type denialLog struct {
	level    denialLevel
	throttle *denialThrottle // with info
	// asError: a denial is returned as a handler error, because
	// something may see the error (see provisionDenialAnswer); else the
	// handler writes the 429 itself.
	asError bool
}

// provisionDenialAnswer decides how the handler answers a denial.
//
// Returned as a handler error, a denial goes through Caddy's error path:
// the server sets the {http.error.*} placeholders, runs the handle_errors
// routes, logs the error (at debug level below 500) and writes the status.
// That path costs a denial more CPU than the decision itself: before it
// checks the log level, the server encodes the whole request for its
// error logger (zap's lazy With is forced by the duration field added to
// it), and it copies the request for the error's context. So when nothing
// could see the error, the handler writes the status itself, the same
// response Caddy would write: no body, the rate limit fields and
// Retry-After. Something could see it when the server has handle_errors
// routes, when an enclosing subroute has errors routes, when the HTTP app
// counts handler errors in its metrics (caddy_http_request_errors_total),
// or when the logs are at debug level (the server's error log line). The
// handler is provisioned inside its server, so all of this is known here;
// handlers provisioned outside a server (tests) return errors.
func (h *Handler) provisionDenialAnswer(ctx caddy.Context) {
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	asError := srv == nil || srv.Errors != nil && len(srv.Errors.Routes) > 0 ||
		h.logger.Core().Enabled(zapcore.DebugLevel)
	for _, m := range ctx.Modules() {
		switch m := m.(type) {
		case *caddyhttp.App:
			asError = asError || m.Metrics != nil
		case *caddyhttp.Subroute:
			asError = asError || m.Errors != nil && len(m.Errors.Routes) > 0
		}
	}
	h.denials.asError = asError
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

// logDenials logs the zones that denied a request, as log_denials says:
// wait is the wait Retry-After gives (jitter included), as caddy-ratelimit
// logged it, and each zone's own wait is its retry_after.
func (h *Handler) logDenials(r *http.Request, ds []zoneDecision, wait time.Duration) {
	lvl := zapcore.DebugLevel
	switch h.denials.level {
	case denialsOff:
		return
	case denialsInfo:
		lvl = zapcore.InfoLevel
	}
	for i := range ds {
		d := &ds[i]
		if d.res.Allowed { // Unknown results are Allowed too
			continue
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
				continue
			}
		}
		ce.Write(zap.String("zone", d.zone.Name), zap.Duration("wait", wait), zap.String("remote_ip", remoteIP(r)),
			h.keyField(d.req.Key), zap.Int64("cost", d.req.Cost), zap.Duration("retry_after", d.res.RetryAfter))
	}
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
