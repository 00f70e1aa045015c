package fleetlimit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// Zone is one limit, kept per client key by one of the algorithms (a token
// bucket unless Algorithm says otherwise).
type Zone struct {
	// Name identifies the zone in headers, placeholders and logs, and is
	// part of every bucket's key: zones of the same name share buckets.
	// Letters, digits, `_`, `-` and `.`, at most 64 characters.
	Name string `json:"name"`

	// Key lists placeholder expressions; the client key is the first one
	// that is not empty. Each alternative is a namespace of its own: a
	// value of the second never shares a bucket with the same value of
	// the first, so a client cannot spend the bucket of `{client_ip}`
	// 192.0.2.7 by sending `X-API-Key: 192.0.2.7`. Keys longer than 64
	// bytes or with unusual characters are hashed (SHA-256), so client
	// input cannot grow the store or break a key. When every expression
	// is empty, all such requests share one bucket. Default:
	// `{http.vars.client_ip}` (one bucket per client IP) for a zone in
	// fleetlimit's form (Rate and Per); none for a zone in
	// caddy-ratelimit's form (Window and Events, in the Caddyfile or
	// JSON), so that its requests all share ONE bucket, as they did in
	// that plugin, whose key defaulted to an empty, static string.
	Key []string `json:"key,omitempty"`

	// Algorithm is how the zone counts: `token_bucket` (a bucket of Burst
	// tokens refilled at Rate per Per; forgives bursts), `sliding_window`
	// (at most Rate per window of Per, estimated from two fixed windows;
	// two counters per key), `fixed_window` (at most Rate per window of
	// Per, windows aligned to the clock; one counter), `sliding_log`
	// (exactly at most Rate in any window of Per; memory grows with the
	// limit), `leaky_bucket` (a shaper: requests over the rate wait for
	// their turn, at most MaxDelay and Burst tokens queued, then proceed
	// at a steady rate) or `concurrency` (at most Limit requests of a key
	// in flight at once, across the fleet). Default: `token_bucket`.
	Algorithm string `json:"algorithm,omitempty"`

	// Rate is how many tokens are refilled every Per (the window
	// algorithms: how many per window of Per). Required (or
	// RatePlaceholder, or Events; not for concurrency).
	Rate int64 `json:"rate,omitempty"`

	// RatePlaceholder takes each request's rate from a placeholder
	// expression instead of Rate (`{plan_rate}`, set by a `map` from the
	// API key: one zone, a rate per tier). The value must be a whole
	// number from 1 to 1,000,000,000; a request with any other value gets
	// status 500 and an error log naming the zone and the value. Rules are
	// compiled once per distinct rate and burst and kept, at most 1,024
	// per zone. A key whose limit changes keeps the time its bucket needs
	// to refill completely, capped at the new burst.
	RatePlaceholder string `json:"rate_placeholder,omitempty"`

	// Per is the refill period of Rate tokens, or the window. Required
	// (or Window).
	Per caddy.Duration `json:"per,omitempty"`

	// Burst is the bucket's capacity, the most a client can spend at
	// once (leaky bucket: the most tokens queued). Token and leaky bucket
	// only. Default: Rate.
	Burst int64 `json:"burst,omitempty"`

	// BurstPlaceholder takes each request's burst from a placeholder
	// expression instead of Burst, with the same rules as
	// RatePlaceholder. Token and leaky bucket only.
	BurstPlaceholder string `json:"burst_placeholder,omitempty"`

	// Reserve sheds a request unless the zone keeps at least this share of
	// its capacity after charging it (the burst for the token and leaky
	// buckets, the limit for the windows): a whole percentage from 0 to
	// 99, with or without `%`, or a placeholder that yields one (from a
	// `map` of the path: 0 for critical routes, 30 for analytics). A
	// request with reserve 0 may take the last token; with 30%, it is
	// shed while the zone holds less than 30% of its capacity plus its
	// cost, and its Retry-After is when the zone will hold that again. An
	// invalid value from a placeholder gets status 500. Not for
	// concurrency. Default: 0.
	Reserve string `json:"reserve,omitempty"`

	// Limit is, for a concurrency zone, how many requests of a key may be
	// in flight at once across the fleet. A request holds a slot from its
	// admission until its response has been written (or it failed,
	// panicked, or its client went away). Required for concurrency, and
	// only there.
	Limit int64 `json:"limit,omitempty"`

	// Lease is, for a concurrency zone on Redis, how long a slot outlives
	// a node that died holding it; a request running longer than its
	// lease loses its slot (give the zone a lease longer than its longest
	// request). Default: 1m.
	Lease caddy.Duration `json:"lease,omitempty"`

	// DryRun makes the zone decide and count as if it were enforced (a
	// request it would deny is not charged), but deny nothing and send no
	// rate limit fields: a request it would deny passes, counted under the
	// outcome `dry_run_denied`, with the event `rate_limit_dry_run` and an
	// info log line (at most one per key and zone per second). The
	// handler's DryRun makes every zone a dry run.
	DryRun bool `json:"dry_run,omitempty"`

	// Ban bans, across the fleet, a key that this zone denied After times
	// within Window, for Duration: every request of the key that the
	// zone applies to is then answered 429 with Retry-After set to the
	// rest of the ban, and no bucket is charged. With DryRun, a ban that
	// would start is only reported.
	Ban *ZoneBan `json:"ban,omitempty"`

	// Prefetch lets a node take up to this many tokens from Redis in one
	// decision (the request's cost, plus spares if the bucket holds them,
	// at most a quarter of what it holds) and admit the key's next
	// requests from its spares without Redis, for hot keys (a global
	// zone, a tenant shared by many clients). Exact: the spares were
	// charged in Redis when taken. Token bucket and fixed window only.
	// Default: none.
	Prefetch int64 `json:"prefetch,omitempty"`

	// PrefetchHold is the longest a node keeps unused spares before it
	// gives them back (and on reload or shutdown): tokens a node holds
	// are idle for the others at most this long. Default: 100ms.
	PrefetchHold caddy.Duration `json:"prefetch_hold,omitempty"`

	// CountStatus makes the zone count only responses of these statuses:
	// codes (`401`) or classes (`4xx`). A request is charged as usual
	// before it passes, and its tokens are given back once its response's
	// status is not one of these (one more store call; if the store fails
	// then, the charge stays). `rate 5 15m` with `count_status 401`
	// allows at most 5 failed logins per 15 minutes. Not for leaky_bucket
	// or concurrency. A request whose client went away after it was
	// passed on, before any status was written, keeps its charge; once a
	// status is written, it is the status, even if the client leaves
	// mid-body.
	// Default: every response counts.
	CountStatus []string `json:"count_status,omitempty"`

	// CostHeader names a response header (or trailer) that carries the
	// request's real cost, known only once the upstream answered (an LLM
	// gateway's tokens used). The request is admitted on its up-front cost
	// (Cost); once the response's headers, or its trailers for a streamed
	// body, carry a non-negative integer in this field, the zone charges
	// the difference (at most the burst) or gives it back, in one more
	// store call after the response. The bucket may then owe more than
	// its capacity: the key's next requests are denied until the refill
	// has repaid it. A missing or invalid value leaves the up-front cost.
	// A trailer wins over the header. A request whose response ended
	// before it reported its cost pays CostHeaderAbort. The zone's quota
	// settles on it too. Token bucket zones and quotas only. Default:
	// none.
	CostHeader string `json:"cost_header,omitempty"`

	// CostHeaderAbort is the cost, in tokens, of a request of a
	// cost_header zone whose response ended before it reported its real
	// cost: its client left before the status or before a trailer the
	// cost could still come in (the header carried none, or announced a
	// trailer), reverse_proxy aborted its stream, or it is a HEAD with no
	// cost in the header. The request is settled on the larger of this,
	// its up-front cost and any cost the header reported, as if the
	// upstream had reported it (at most the burst beyond the up-front
	// cost, as any settlement); the zone's quota counts the same. Default:
	// the most a settlement can charge: the up-front cost plus the zone's
	// burst (a quota alone: plus its quota), so that no client pays less
	// by hanging up than by reading the answer to its end.
	CostHeaderAbort int64 `json:"cost_header_abort,omitempty"`

	// MaxDelay is the longest a leaky bucket lets a request wait for its
	// turn; a request that would wait longer is denied. Default: 10s, or
	// as long as the queue (Burst) takes to drain if that is shorter.
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`

	// MaxWaiting is, for a leaky bucket or a soft-shedding token bucket,
	// how many of the zone's requests this node holds waiting at once
	// (for their turn, or their soft shed delay); a request that would
	// wait beyond it is answered 429, with Retry-After its wait, and
	// charged nothing. Default: 1024.
	MaxWaiting int64 `json:"max_waiting,omitempty"`

	// SoftShed delays, rather than denies, a key that has used more than
	// this share of its burst, a whole percentage from 1 to 99: each
	// request the zone admits past that point waits before it is passed
	// on, in proportion to how far past it the request left the bucket,
	// up to SoftShedMaxDelay for the request that takes the last token. A
	// key that slows down is never denied; one that does not is denied as
	// before, and the zone never admits more than without it. Token
	// bucket only. Default: none.
	SoftShed int64 `json:"soft_shed,omitempty"`

	// SoftShedMaxDelay is the longest a soft-shedding zone delays a
	// request (the request that takes the last token of the burst): at
	// most 1h. Default: 1s.
	SoftShedMaxDelay caddy.Duration `json:"soft_shed_max_delay,omitempty"`

	// Window is mholt/caddy-ratelimit's form of the period: at most
	// Events in any Window (a sliding log unless Algorithm says
	// otherwise). Use Window and Events instead of Rate and Per.
	Window caddy.Duration `json:"window,omitempty"`

	// Events is mholt/caddy-ratelimit's form of the limit: at most Events
	// requests in any Window.
	Events int64 `json:"events,omitempty"`

	// IPv4Prefix makes client keys that are IPv4 addresses share a bucket
	// per network of this many bits (ipv4_prefix 24: one limit per /24).
	// Default: 32 (one bucket per address).
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix makes client keys that are IPv6 addresses share a bucket
	// per network of this many bits: with ipv6_prefix 64, a client
	// rotating through the addresses of its /64 gets one limit. Default:
	// 128 (one bucket per address).
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// Quota is the most a key may spend per calendar period (QuotaPer, in
	// QuotaTZ), counted in the zone's cost: `quota 10000 per month`. The
	// count starts afresh at each period's first instant, on Redis' clock
	// (the memory store: this node's). With a rate (a plan: a rate and a
	// monthly quota), the quota is a second rule of the zone, decided in
	// the same store call on the same key and cost and reported as the
	// zone `<name>.quota` in the rate limit fields, placeholders and
	// metrics; without one, the quota is the zone's only limit. At most
	// 2^40. Default: none.
	Quota int64 `json:"quota,omitempty"`

	// QuotaPlaceholder takes each request's quota from a placeholder
	// expression instead of Quota (tiers: `{vars.plan_quota}` from a
	// `map` of the API key), with the rules of RatePlaceholder.
	QuotaPlaceholder string `json:"quota_placeholder,omitempty"`

	// QuotaPer is the quota's calendar period: `day`, `week` (from
	// Monday) or `month`. Required with a quota.
	QuotaPer string `json:"quota_per,omitempty"`

	// QuotaTZ is the IANA time zone whose calendar the quota's periods
	// follow, daylight saving included (`Europe/Berlin`: a day of 23 or
	// 25 hours when the clocks change). Default: UTC.
	QuotaTZ string `json:"quota_tz,omitempty"`

	// Cost is how many tokens a request takes: an integer, or a
	// placeholder expression that yields one (a request for which it is
	// not a non-negative integer gets status 400). Default: 1.
	Cost string `json:"cost,omitempty"`

	// OnError is what the zone does when Redis cannot decide (down, hung
	// beyond the timeout, out of memory, refusing the credentials, or the
	// circuit breaker open): `local` decides on a bucket in this node's
	// memory with the zone's rate and burst divided by the fleet's size
	// (see FleetSize), so the limit stays on; `deny` rejects the request
	// with 503 and Retry-After (fail closed, for abuse-sensitive routes
	// such as login); `allow` lets it pass unlimited (fail open). The
	// memory store never fails. Default: `local`.
	OnError string `json:"on_error,omitempty"`

	// FleetSize is how many nodes share the zone's limit, for the `local`
	// policy: each node's fallback bucket gets 1/FleetSize of the rate and
	// burst, so the fleet stays about within the limit while Redis is
	// away. Default: the nodes the fleet view saw in the last 10 seconds
	// (this one included), or 1 when it has seen no other (or metrics are
	// disabled).
	FleetSize int64 `json:"fleet_size,omitempty"`

	// Exempt lists clients that the zone never limits: IP addresses, CIDR
	// networks or `private_ranges`, matched against Caddy's client IP
	// (`{client_ip}`, which honours the server's `trusted_proxies`). A
	// request from one is left out of the zone as if its matchers had not
	// matched, but counted under the outcome `exempt`: it costs the zone
	// nothing, no store call for it, and gets no rate limit fields of the
	// zone. Default: none.
	Exempt []string `json:"exempt,omitempty"`

	// MatcherSetsRaw limits the zone to matching requests. Default: all
	// requests that reach the handler.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	rule        *limiter.Rule // the zone's rule (with placeholders: for their stand-in values)
	base        *appliedRule  // rule, with its field values
	rules       *ruleCache    // the rules of placeholder values; nil without placeholders
	lastTier    *lastTiers    // the tier that applied last to a key (with rules)
	matchers    caddyhttp.MatcherSets
	exempt      exemptSet // Exempt, parsed
	route       string    // the zone's matchers as configured (JSON), for the denial feed
	keys        []keyExpr
	cost        int64  // the static cost, when costExpr is empty
	costExpr    string // placeholder expression of a dynamic cost
	reserve     int64  // the static reserve, when reserveExpr is empty
	reserveExpr string // placeholder expression of a dynamic reserve
	counted     statusSet
	countStatus bool   // counted applies: the zone refunds what it does not count
	costHeader  string // CostHeader, canonical; empty: none
	costAbort   int64  // CostHeaderAbort (a quota's: its zone's); 0: the default
	allDryRun   bool   // the handler's dry_run
	errDenied   error
	errNever    error
	errBanned   error
	errBadCost  error
	errWaiting  error         // the wait room is full
	room        *waitRoom     // leaky bucket, soft shed: the requests waiting
	obs         *observe.Zone // placeholders and stats
	quotaOf     *Zone         // the zone whose quota this zone is (expandQuotas); nil for a configured zone
}

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

// A zone with a rate and a quota (a plan) gets, at provisioning, a second
// zone right after it, `<name>.quota`, whose rule is the quota: decided
// whenever its zone applies, on the zone's key and cost, in the same store
// call (see Zone.quotaDecision), with its own fields, metrics and stats.

// quotaSuffix names a zone's quota when the zone has a rate too.
const quotaSuffix = ".quota"

// hasQuota reports whether the zone is configured with a quota.
func (z *Zone) hasQuota() bool { return z.Quota != 0 || z.QuotaPlaceholder != "" }

// hasRate reports whether the zone is configured with a limit other than a
// quota: a rate, caddy-ratelimit's window and events, or concurrency.
func (z *Zone) hasRate() bool {
	return z.Rate != 0 || z.RatePlaceholder != "" || z.legacyForm() || z.Algorithm == "concurrency" || z.Limit != 0
}

// quotaOnly reports whether the zone's rule is its quota: a quota and no
// other limit (a zone's quota zone is one).
func (z *Zone) quotaOnly() bool { return z.hasQuota() && !z.hasRate() }

// configuredName is the name the zone was configured with: a quota zone's
// is its zone's.
func (z *Zone) configuredName() string {
	if z.quotaOf != nil {
		return z.quotaOf.Name
	}
	return z.Name
}

// expandQuotas places, right after each zone that has a rate and a quota,
// the zone of its quota (once: Provision runs once per handler).
func (h *Handler) expandQuotas() {
	for i := 0; i < len(h.Zones); i++ {
		z := h.Zones[i]
		if !z.hasQuota() || z.quotaOnly() || (i+1 < len(h.Zones) && h.Zones[i+1].quotaOf == z) {
			continue
		}
		q := &Zone{
			Name:  z.Name + quotaSuffix,
			Quota: z.Quota, QuotaPlaceholder: z.QuotaPlaceholder, QuotaPer: z.QuotaPer, QuotaTZ: z.QuotaTZ,
			// What the quota shares with its zone: the key (for the
			// admin API's lookups; a request's is its zone's), whether
			// a response counts, the failure policy, the dry run.
			Key: z.Key, IPv4Prefix: z.IPv4Prefix, IPv6Prefix: z.IPv6Prefix,
			CountStatus: z.CountStatus, OnError: z.OnError, FleetSize: z.FleetSize, DryRun: z.DryRun,
			quotaOf: z,
		}
		h.Zones = append(h.Zones[:i+1], append([]*Zone{q}, h.Zones[i+1:]...)...)
		i++
	}
}

// provision compiles the zone's rule, keys, cost and matchers, and the
// header values and errors it answers with.
func (z *Zone) provision(ctx caddy.Context) error {
	if err := z.validate(); err != nil {
		return err
	}
	rule, err := z.compileRule(z.standIn())
	if err != nil {
		return err
	}
	z.rule, z.base, z.rules = rule, newApplied(z.Name, rule), nil
	if z.RatePlaceholder != "" || z.BurstPlaceholder != "" || (z.quotaOnly() && z.QuotaPlaceholder != "") {
		z.rules = &ruleCache{m: make(map[[2]int64]*cachedRule), size: defaultRuleCacheSize, name: z.Name,
			build: func(rate, burst int64) (*limiter.Rule, error) { return z.compileRule(rate, burst) }}
		z.lastTier = newLastTiers()
	}
	z.exempt, _ = parseExempt(z.Exempt) // validated
	z.provisionKeys()
	z.provisionCost()
	z.provisionReserve()
	z.costHeader, z.costAbort = "", 0
	if h := z.costHeaderName(); h != "" {
		z.costHeader, z.costAbort = http.CanonicalHeaderKey(h), z.costHeaderAbort()
	}
	z.counted, z.countStatus = statusSet{}, len(z.CountStatus) > 0
	if z.countStatus {
		z.counted, _ = parseStatusSet(z.CountStatus)
	}
	if z.MatcherSetsRaw != nil {
		// Described before LoadModule, which clears the raw matchers.
		if b, err := json.Marshal(z.MatcherSetsRaw); err == nil {
			z.route = string(b)
		}
		mods, err := ctx.LoadModule(z, "MatcherSetsRaw")
		if err != nil {
			return fmt.Errorf("loading matchers: %w", err)
		}
		if err := z.matchers.FromInterface(mods); err != nil {
			return err
		}
	}

	z.errDenied = fmt.Errorf("rate limit exceeded in zone %q", z.Name)
	z.errBanned = fmt.Errorf("key banned in zone %q", z.Name)
	z.errNever = fmt.Errorf("request cost exceeds the burst of zone %q", z.Name)
	z.errBadCost = fmt.Errorf("zone %q: request cost is not a non-negative integer", z.Name)
	z.errWaiting = fmt.Errorf("too many requests waiting for their turn in zone %q", z.Name)
	if rule.Algorithm() == limiter.LeakyBucket || z.SoftShed > 0 {
		z.room = newWaitRoom(cmp.Or(z.MaxWaiting, DefaultMaxWaiting), z.SoftShed > 0)
	}
	return nil
}

// provisionCost compiles the zone's validated cost: a static one, or a
// placeholder expression.
func (z *Zone) provisionCost() {
	switch c := strings.TrimSpace(z.Cost); {
	case c == "":
		z.cost = 1
	case strings.ContainsAny(c, "{}"):
		z.costExpr = c
	default:
		z.cost, _ = strconv.ParseInt(c, 10, 64)
	}
}

// legacyForm reports whether the zone gives its limit in caddy-ratelimit's
// form, window and events.
func (z *Zone) legacyForm() bool {
	return z.Window != 0 || z.Events != 0
}

// costHeaderName returns the response field the zone reads its real cost
// from: its own cost_header, or, for a quota beside a rate, its zone's.
func (z *Zone) costHeaderName() string {
	if z.quotaOf != nil {
		return z.quotaOf.CostHeader
	}
	return z.CostHeader
}

// costHeaderAbort returns the zone's abort charge: its own
// CostHeaderAbort, or, for a quota beside a rate, its zone's.
func (z *Zone) costHeaderAbort() int64 {
	if z.quotaOf != nil {
		return z.quotaOf.CostHeaderAbort
	}
	return z.CostHeaderAbort
}

// observeConfig is what observe needs of the zone beyond its rule: what
// its matchers match (from the configuration), its key normalisation, and
// its tiers, for the key lookup.
func (z *Zone) observeConfig() observe.ZoneConfig {
	oc := observe.ZoneConfig{Match: z.route, LastRule: z.lastRule}
	if z.rules != nil {
		oc.Rules = z.rules.all
	}
	if z.room != nil {
		oc.MaxWaiting, oc.Queue = z.room.max, z.room.counts
	}
	if n := len(z.keys); n > 0 {
		oc.Keys = func(v string) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = z.normalKey(i, v)
			}
			return out
		}
	}
	return oc
}

// costOf returns the request's cost in this zone; false when a dynamic cost
// is not a non-negative integer.
func (z *Zone) costOf(repl *caddy.Replacer) (int64, bool) {
	if z.costExpr == "" {
		return z.cost, true
	}
	n, err := strconv.ParseInt(strings.TrimSpace(repl.ReplaceKnown(z.costExpr, "")), 10, 64)
	return n, err == nil && n >= 0
}
