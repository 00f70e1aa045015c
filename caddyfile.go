package fleetlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	rate_limit [<matcher>] {
//	    redis {
//	        address    <host:port> [<host:port>...]   # several: a Cluster
//	        cluster                                   # Cluster with one seed
//	        sentinel   <master_name> <addr>...
//	        sentinel_username <user>
//	        sentinel_password <password>
//	        username   <user>
//	        password   <password>
//	        db         <n>
//	        tls {
//	            ca <file>
//	            cert <file>
//	            key <file>
//	            server_name <name>
//	            insecure_skip_verify
//	        }
//	        pool_size  <n>
//	        pipelines  <n>
//	        dial_timeout <duration>
//	        protocol   2|3
//	        disable_identity
//	        key_prefix <prefix>
//	        timeout    <duration>
//	        max_wait   <duration>
//	        disable_stall_clock
//	        deny_cache_size <n>
//	        breaker_failures <n>
//	        breaker_cooldown <duration>
//	    }
//	    zone <name> {
//	        key   <expr> [<expr>...]
//	        rate  <n|placeholder> <duration>
//	        burst <n|placeholder>
//	        algorithm token_bucket|sliding_window|fixed_window|sliding_log|leaky_bucket|concurrency
//	        limit <n>                        # concurrency
//	        lease <duration>                 # concurrency
//	        reserve <percent|placeholder>
//	        count_status <code|class>...
//	        cost_header <response header> [abort <n>]  # token_bucket, quota: settle the real cost after the response
//	        ban <duration> after <n> in <window>
//	        dry_run
//	        prefetch <n> [<max_hold>]        # token_bucket, fixed_window: hot keys
//	        soft_shed <percent> [<max_delay>] # token_bucket: delay past percent of the burst
//	        max_delay <duration>
//	        max_waiting <n>
//	        window <duration>                # caddy-ratelimit's form, with events
//	        events <n>
//	        ipv4_prefix <bits>
//	        ipv6_prefix <bits>
//	        quota <n|placeholder> per day|week|month [tz <IANA zone>]
//	        cost  <n|placeholder>
//	        on_error allow|deny|local
//	        fleet_size <n>
//	        exempt <ip|cidr|private_ranges>...
//	        match { <matchers> }
//	    }
//	    exempt <ip|cidr|private_ranges>...  # never limited by any zone
//	    headers ietf|legacy|both|none
//	    log_key
//	    key_digest_secret <secret>
//	    dry_run                           # every zone a dry run
//	    log_denials info|debug|off
//	    disable_metrics
//	    max_keys <n>
//	    jitter <share|percent|percent%>   # 0.2, 20 and 20% all mean up to 20%
//	    sweep_interval <duration>
//	    distributed {                     # caddy-ratelimit's; ignored
//	        read_interval <duration>
//	        write_interval <duration>
//	        purge_age <duration>
//	    }
//	    storage <module> { ... }          # caddy-ratelimit's; ignored
//	}
//
// A zone in caddy-ratelimit's form (window and events) without a key is
// one bucket shared by all its requests, as it was in that plugin; a zone
// in fleetlimit's form (rate) without a key has a bucket per client IP.
//
// Every mistake is reported with the file and line of the offending token.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	// Where the directive is, for errors about what its block lacks.
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	return unmarshalBlock(d, start, "", func(sub string, lines settingLines) error {
		return h.unmarshalSubdirective(d, sub, lines)
	}, h.validate)
}

// unmarshalBlock reads the subdirectives of a block, d past the arguments
// of the directive that opens it and start on that directive: set sets up
// each one, and check checks the block once it ends (its error prefixed
// with what, unless empty). lines notes where each subdirective was given,
// and set may note more (the setting a line stands for), so that a mistake
// that check finds in one setting (a *settingError) is reported at the
// line that gave it, and any other at start's.
func unmarshalBlock(d *caddyfile.Dispenser, start caddyfile.Dispenser, what string,
	set func(sub string, lines settingLines) error, check func() error) error {
	lines := settingLines{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		lines[sub] = *d
		if err := set(sub, lines); err != nil {
			return err
		}
	}
	err := check()
	if err == nil {
		return nil
	}
	if what != "" {
		err = fmt.Errorf("%s: %w", what, err)
	}
	return lines.wrap(start, err)
}

// unmarshalSubdirective sets up one subdirective of the rate_limit block.
func (h *Handler) unmarshalSubdirective(d *caddyfile.Dispenser, sub string, lines settingLines) error {
	switch sub {
	case "redis":
		if h.Redis != nil {
			return d.Err("redis: only one redis block is allowed")
		}
		h.Redis = new(RedisConfig)
		return h.Redis.unmarshalCaddyfile(d)
	case "zone":
		lines[zoneSetting(len(h.Zones))] = *d
		z := new(Zone)
		if err := z.unmarshalCaddyfile(d); err != nil {
			return err
		}
		h.Zones = append(h.Zones, z)
		return nil
	case "exempt":
		if err := unmarshalExempt(d, &h.Exempt); err != nil {
			return d.WrapErr(err)
		}
		return nil
	case "distributed", "storage":
		return h.unmarshalCompat(d)
	}
	return h.unmarshalSetting(d, sub)
}

// settingLines are where a block gave each of its settings (the last time),
// so that a mistake that a validate method finds is reported at the line of
// the setting at fault (see settingError), or else at the block's own line.
type settingLines map[string]caddyfile.Dispenser

// wrap adds to err the line of the setting at fault, or block's.
func (l settingLines) wrap(block caddyfile.Dispenser, err error) error {
	at := block
	if se, ok := errors.AsType[*settingError](err); ok {
		if d, ok := l[se.setting]; ok {
			at = d
		}
	}
	return at.WrapErr(err)
}

// find returns the setting of that name.
func find[S, T any](settings []setting[S, T], name string) (setting[S, T], bool) {
	for _, s := range settings {
		if s.name == name {
			return s, true
		}
	}
	return setting[S, T]{}, false
}

// names returns the names of settings.
func names[S, T any](settings []setting[S, T]) []string {
	out := make([]string, len(settings))
	for i, s := range settings {
		out[i] = s.name
	}
	return out
}

// subdirectives lists every name of the lists, sorted, for errors that say
// what a block takes.
func subdirectives(lists ...[]string) string {
	return oneOf(slices.Sorted(slices.Values(slices.Concat(lists...))))
}

// The rate_limit block's settings: handlerFlags take no argument,
// handlerSettings one, and handlerBlocks are parsed on their own.
var (
	handlerFlags = []setting[Handler, bool]{
		{"log_key", func(h *Handler) *bool { return &h.LogKey }},
		{"disable_metrics", func(h *Handler) *bool { return &h.DisableMetrics }},
		{"dry_run", func(h *Handler) *bool { return &h.DryRun }},
	}
	handlerSettings = map[string]func(h *Handler, arg string) error{
		"headers":           func(h *Handler, arg string) error { h.Headers = arg; return nil },
		"log_denials":       func(h *Handler, arg string) error { h.LogDenials = arg; return nil },
		"key_digest_secret": func(h *Handler, arg string) error { h.KeyDigestSecret = arg; return nil },
		"max_keys": func(h *Handler, arg string) error {
			n, err := positiveInt("max_keys", arg, 32)
			h.MaxKeys = int(n)
			return err
		},
		"jitter": func(h *Handler, arg string) (err error) {
			h.Jitter, err = parseJitter(arg)
			return err
		},
		"sweep_interval": func(h *Handler, arg string) (err error) {
			h.SweepInterval, err = positiveDuration("sweep_interval", arg)
			return err
		},
	}
	handlerBlocks = []string{"redis", "zone", "exempt", "distributed", "storage"}
)

// unmarshalSetting sets up a rate_limit subdirective of handlerFlags or
// handlerSettings, and reports any other as unknown.
func (h *Handler) unmarshalSetting(d *caddyfile.Dispenser, sub string) error {
	if f, ok := find(handlerFlags, sub); ok {
		if d.NextArg() {
			return d.ArgErr()
		}
		*f.field(h) = true
		return nil
	}
	set, ok := handlerSettings[sub]
	if !ok {
		return d.Errf("unknown subdirective %q (want %s)", sub,
			subdirectives(handlerBlocks, names(handlerFlags), slices.Collect(maps.Keys(handlerSettings))))
	}
	var arg string
	if !d.AllArgs(&arg) {
		if sub == "key_digest_secret" {
			// ArgErr would quote the secret.
			return d.Err("key_digest_secret takes one argument")
		}
		return d.ArgErr()
	}
	if err := set(h, arg); err != nil {
		return d.WrapErr(err)
	}
	return nil
}

// parseJitter reads the Caddyfile's jitter: a number, read as Jitter is,
// or a percentage such as `20%` or `1.5%`, returned as a share.
func parseJitter(arg string) (float64, error) {
	if p, ok := strings.CutSuffix(arg, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 0 || v > 100 || math.IsNaN(v) {
			return 0, fmt.Errorf("jitter percentage must be 0%% to 100%%, got %q", arg)
		}
		return v / 100, nil
	}
	v, err := strconv.ParseFloat(arg, 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("jitter must be a share (0 to 1), a whole percentage (2 to 100) or a percentage such as 1.5%%, got %q", arg)
	}
	if _, err := jitterShare(v); err != nil {
		return 0, err
	}
	return v, nil
}

// distributedSettings are the settings of caddy-ratelimit's distributed
// block, each a duration.
var distributedSettings = []setting[LegacyDistributed, caddy.Duration]{
	{"read_interval", func(l *LegacyDistributed) *caddy.Duration { return &l.ReadInterval }},
	{"write_interval", func(l *LegacyDistributed) *caddy.Duration { return &l.WriteInterval }},
	{"purge_age", func(l *LegacyDistributed) *caddy.Duration { return &l.PurgeAge }},
}

// unmarshalCompat sets up caddy-ratelimit's blocks, distributed and
// storage, which fleetlimit accepts so that that plugin's Caddyfiles load.
func (h *Handler) unmarshalCompat(d *caddyfile.Dispenser) error {
	switch d.Val() {
	case "distributed":
		if d.NextArg() {
			return d.ArgErr()
		}
		h.Distributed = new(LegacyDistributed)
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			sub := d.Val()
			var arg string
			if !d.AllArgs(&arg) {
				return d.ArgErr()
			}
			dur, err := positiveDuration("distributed "+sub, arg)
			if err != nil {
				return d.WrapErr(err)
			}
			s, ok := find(distributedSettings, sub)
			if !ok {
				return d.Errf("unknown distributed subdirective %q (want %s)", sub, oneOf(names(distributedSettings)))
			}
			*s.field(h.Distributed) = dur
		}
	case "storage":
		// caddy-ratelimit's storage module: its name, and whatever
		// arguments and block it has, are skipped (see Handler.Storage).
		if !d.NextArg() {
			return d.ArgErr()
		}
		name := d.Val()
		d.RemainingArgs()
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			d.RemainingArgs()
		}
		h.Storage, _ = json.Marshal(map[string]string{"module": name})
	}
	return nil
}

// UnmarshalCaddyfile reads a redis block, the dispenser on its `redis`
// token, as the rate_limit directive reads it: the same subdirectives,
// checked the same way, errors with the file and line.
func (c *RedisConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return c.unmarshalCaddyfile(d)
}

// redisOthers are the redis subdirectives outside the tables of
// RedisConfig's settings (redisStrings and the rest), which
// unmarshalSetting parses on their own.
var redisOthers = []string{"address", "sentinel", "tls", "db", "protocol"}

func (c *RedisConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	return unmarshalBlock(d, start, "redis", func(sub string, _ settingLines) error {
		return c.unmarshalSetting(d, sub)
	}, c.validate)
}

// unmarshalSetting sets up one redis subdirective.
func (c *RedisConfig) unmarshalSetting(d *caddyfile.Dispenser, sub string) error {
	switch sub {
	case "address":
		addrs := d.RemainingArgs()
		if len(addrs) == 0 {
			return d.ArgErr()
		}
		if c.Address != "" || len(c.Addresses) > 0 {
			return d.Err("redis address given twice (list every Cluster node on one address line)")
		}
		if len(addrs) == 1 {
			c.Address = addrs[0]
		} else {
			c.Addresses = addrs
		}
		return nil
	case "sentinel":
		args := d.RemainingArgs()
		if len(args) < 2 {
			return d.Err("redis sentinel needs the master name and at least one sentinel address: sentinel <master_name> <addr>...")
		}
		c.SentinelMaster, c.SentinelAddresses = args[0], args[1:]
		return nil
	case "tls":
		if c.TLS != nil {
			return d.Err("redis: only one tls block is allowed")
		}
		c.TLS = new(RedisTLS)
		return c.TLS.unmarshalCaddyfile(d)
	}
	if f, ok := find(redisFlags, sub); ok {
		if d.NextArg() {
			return d.ArgErr()
		}
		*f.field(c) = true
		return nil
	}
	str, isString := find(redisStrings, sub)
	dur, isDuration := find(redisDurations, sub)
	count, isCount := find(redisCounts, sub)
	if !isString && !isDuration && !isCount && !slices.Contains(redisOthers, sub) {
		return d.Errf("unknown redis subdirective %q (want %s)", sub,
			subdirectives(redisOthers, names(redisFlags), names(redisStrings), names(redisDurations), names(redisCounts)))
	}
	// The rest take one argument.
	var arg string
	if !d.AllArgs(&arg) {
		if strings.HasSuffix(sub, "password") {
			// ArgErr would quote the password.
			return d.Errf("redis %s takes one argument (quote it if it has spaces)", sub)
		}
		return d.ArgErr()
	}
	var err error
	switch {
	case isString:
		*str.field(c) = arg
	case isDuration:
		*dur.field(c), err = positiveDuration(sub, arg)
	case isCount:
		var n int64
		n, err = positiveInt(sub, arg, 32)
		*count.field(c) = int(n)
	case sub == "db":
		n, perr := strconv.ParseInt(arg, 10, 32)
		if perr != nil || n < 0 {
			err = fmt.Errorf("db must be a non-negative integer, got %q", arg)
		}
		c.DB = int(n)
	case sub == "protocol":
		c.Protocol, err = strconv.Atoi(arg)
		if err != nil {
			err = fmt.Errorf("protocol must be 2 or 3, got %q", arg)
		}
	}
	if err != nil {
		return d.Errf("redis %v", err)
	}
	return nil
}

// The redis tls block's settings: the files and names, and the flag.
var (
	tlsSettings = []setting[RedisTLS, string]{
		{"ca", func(t *RedisTLS) *string { return &t.CA }},
		{"cert", func(t *RedisTLS) *string { return &t.Cert }},
		{"key", func(t *RedisTLS) *string { return &t.Key }},
		{"server_name", func(t *RedisTLS) *string { return &t.ServerName }},
	}
	tlsFlags = []setting[RedisTLS, bool]{
		{"insecure_skip_verify", func(t *RedisTLS) *bool { return &t.InsecureSkipVerify }},
	}
)

func (t *RedisTLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	return unmarshalBlock(d, start, "redis: tls", func(sub string, _ settingLines) error {
		return t.unmarshalSetting(d, sub)
	}, t.validate)
}

// unmarshalSetting sets up one redis tls subdirective.
func (t *RedisTLS) unmarshalSetting(d *caddyfile.Dispenser, sub string) error {
	if f, ok := find(tlsFlags, sub); ok {
		if d.NextArg() {
			return d.ArgErr()
		}
		*f.field(t) = true
		return nil
	}
	s, ok := find(tlsSettings, sub)
	if !ok {
		return d.Errf("unknown redis tls subdirective %q (want %s)", sub, subdirectives(names(tlsSettings), names(tlsFlags)))
	}
	if !d.AllArgs(s.field(t)) {
		return d.ArgErr()
	}
	return nil
}

// The zone block's settings that take one argument (key, rate and match
// are parsed on their own), and those that give its limit, whose line is
// where a mistake in the limit is reported.
var (
	zoneSettings = map[string]func(z *Zone, sub, arg string) error{
		"burst": func(z *Zone, sub, arg string) (err error) {
			if strings.Contains(arg, "{") {
				z.BurstPlaceholder = arg
				return nil
			}
			z.Burst, err = positiveInt(sub, arg, 64)
			return err
		},
		"limit":       zoneInt(func(z *Zone) *int64 { return &z.Limit }, 32),
		"lease":       zoneDuration(func(z *Zone) *caddy.Duration { return &z.Lease }),
		"reserve":     func(z *Zone, _, arg string) error { z.Reserve = arg; return validateReserve(arg) },
		"events":      zoneInt(func(z *Zone) *int64 { return &z.Events }, 54),
		"fleet_size":  zoneInt(func(z *Zone) *int64 { return &z.FleetSize }, 32),
		"max_delay":   zoneDuration(func(z *Zone) *caddy.Duration { return &z.MaxDelay }),
		"max_waiting": zoneInt(func(z *Zone) *int64 { return &z.MaxWaiting }, 32),
		"window":      zoneDuration(func(z *Zone) *caddy.Duration { return &z.Window }),
		"cost":        func(z *Zone, _, arg string) error { z.Cost = arg; return nil },
		"on_error":    func(z *Zone, _, arg string) error { z.OnError = arg; return nil },
		"algorithm":   func(z *Zone, _, arg string) error { z.Algorithm = arg; return nil },
		"ipv4_prefix": zonePrefix(func(z *Zone) *int { return &z.IPv4Prefix }),
		"ipv6_prefix": zonePrefix(func(z *Zone) *int { return &z.IPv6Prefix }),
	}
	zoneLists     = []string{"key", "rate", "match", "ban", "count_status", "cost_header", "dry_run", "prefetch", "exempt", "quota", "soft_shed"}
	zoneRuleLines = []string{"algorithm", "rate", "burst", "max_delay", "window", "events", "limit", "lease", "prefetch"}
)

// zoneInt, zoneDuration and zonePrefix parse a zone setting into a field.
func zoneInt(field func(*Zone) *int64, bits int) func(z *Zone, sub, arg string) error {
	return func(z *Zone, sub, arg string) (err error) {
		*field(z), err = positiveInt(sub, arg, bits)
		return err
	}
}

func zoneDuration(field func(*Zone) *caddy.Duration) func(z *Zone, sub, arg string) error {
	return func(z *Zone, sub, arg string) (err error) {
		*field(z), err = positiveDuration(sub, arg)
		return err
	}
}

func zonePrefix(field func(*Zone) *int) func(z *Zone, sub, arg string) error {
	return func(z *Zone, sub, arg string) error {
		n, err := positiveInt(sub, arg, 32)
		*field(z) = int(n)
		return err
	}
}

func (z *Zone) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if !d.NextArg() {
		return d.Err("zone needs a name: zone <name> { ... }")
	}
	z.Name = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return unmarshalBlock(d, start, fmt.Sprintf("zone %q", z.Name), func(sub string, lines settingLines) error {
		if slices.Contains(zoneRuleLines, sub) {
			lines["rule"] = *d
		}
		return z.unmarshalSetting(d, sub)
	}, z.validate)
}

// unmarshalSetting sets up one zone subdirective.
func (z *Zone) unmarshalSetting(d *caddyfile.Dispenser, sub string) error {
	switch sub {
	case "key":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.ArgErr()
		}
		z.Key = args
		return nil
	case "rate":
		return z.unmarshalRate(d)
	case "ban":
		return z.unmarshalBan(d)
	case "prefetch":
		return z.unmarshalPrefetch(d)
	case "quota":
		return z.unmarshalQuota(d)
	case "soft_shed":
		return z.unmarshalSoftShed(d)
	case "dry_run":
		if d.NextArg() {
			return d.ArgErr()
		}
		z.DryRun = true
		return nil
	case "count_status":
		args := d.RemainingArgs()
		if _, err := parseStatusSet(args); err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
		z.CountStatus = args
		return nil
	case "cost_header":
		args := d.RemainingArgs()
		if (len(args) != 1 && len(args) != 3) || (len(args) == 3 && args[1] != "abort") {
			return d.Errf("zone %q: cost_header takes one response header name, then optionally what a request pays when its response ends before reporting its cost: cost_header <header> [abort <n>]", z.Name)
		}
		if !validFieldName(args[0]) {
			return d.Errf("zone %q: cost_header %q is not a header field name", z.Name, args[0])
		}
		z.CostHeader = args[0]
		if len(args) == 3 {
			n, err := strconv.ParseInt(args[2], 10, 64)
			if err != nil || n < 1 {
				return d.Errf("zone %q: cost_header's abort takes a positive whole number of tokens, got %q", z.Name, args[2])
			}
			z.CostHeaderAbort = n
		}
		return nil
	case "exempt":
		if err := unmarshalExempt(d, &z.Exempt); err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
		return nil
	case "match":
		if d.NextArg() {
			return d.ArgErr()
		}
		set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
		if err != nil {
			return err
		}
		z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
		return nil
	}
	set, ok := zoneSettings[sub]
	if !ok {
		return d.Errf("zone %q: unknown subdirective %q (want %s)", z.Name, sub,
			subdirectives(zoneLists, slices.Collect(maps.Keys(zoneSettings))))
	}
	var arg string
	if !d.AllArgs(&arg) {
		return d.ArgErr()
	}
	if err := set(z, sub, arg); err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	return nil
}

// unmarshalRate sets up rate <n> <duration>.
func (z *Zone) unmarshalRate(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return d.Errf("zone %q: rate needs two arguments: rate <n|placeholder> <duration>", z.Name)
	}
	if strings.Contains(args[0], "{") {
		per, err := positiveDuration("rate period", args[1])
		if err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
		z.RatePlaceholder, z.Per = args[0], per
		return nil
	}
	n, err := positiveInt("rate", args[0], 64)
	if err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	if n > 1<<53 { // the adapter's JSON goes through float64
		return d.Errf("zone %q: rate must be at most 2^53, got %q", z.Name, args[0])
	}
	per, err := positiveDuration("rate period", args[1])
	if err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	z.Rate, z.Per = n, per
	return nil
}

// unmarshalPrefetch sets up prefetch <n> [<max_hold>].
func (z *Zone) unmarshalPrefetch(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.Errf("zone %q: prefetch takes: prefetch <n> [<max_hold>]", z.Name)
	}
	n, err := positiveInt("prefetch", args[0], 32)
	if err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	z.Prefetch = n
	if len(args) == 2 {
		if z.PrefetchHold, err = positiveDuration("prefetch max_hold", args[1]); err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
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

// unmarshalQuota sets up quota <n|placeholder> per day|week|month
// [tz <zone>].
func (z *Zone) unmarshalQuota(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if (len(args) != 3 && len(args) != 5) || args[1] != "per" || (len(args) == 5 && args[3] != "tz") {
		return d.Errf("zone %q: quota takes: quota <n|placeholder> per day|week|month [tz <IANA zone>]", z.Name)
	}
	if strings.Contains(args[0], "{") {
		z.QuotaPlaceholder = args[0]
	} else {
		n, err := positiveInt("quota", args[0], 64)
		if err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
		if n > limiter.MaxQuota {
			return d.Errf("zone %q: quota must be at most 2^40 per period, got %s", z.Name, args[0])
		}
		z.Quota = n
	}
	if _, err := limiter.ParsePeriod(args[2]); err != nil {
		return d.Errf("zone %q: %v", z.Name, err)
	}
	z.QuotaPer = args[2]
	if len(args) == 5 {
		if _, err := quotaLocation(args[4]); err != nil {
			return d.Errf("zone %q: %v", z.Name, err)
		}
		z.QuotaTZ = args[4]
	}
	return nil
}

// unmarshalSoftShed sets up soft_shed <percent> [<max_delay>].
func (z *Zone) unmarshalSoftShed(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.Errf("zone %q: soft_shed takes: soft_shed <percent> [<max_delay>]", z.Name)
	}
	pct, err := strconv.ParseInt(strings.TrimSuffix(args[0], "%"), 10, 64)
	if err != nil || pct < 1 || pct > 99 {
		return d.Errf("zone %q: soft_shed must be a whole percentage from 1 to 99, got %q", z.Name, args[0])
	}
	z.SoftShed = pct
	if len(args) == 2 {
		dur, err := caddy.ParseDuration(args[1])
		if err != nil || dur <= 0 || dur > limiter.MaxSoftShedDelay {
			return d.Errf("zone %q: soft_shed's max delay must be a positive duration of at most %s, got %q",
				z.Name, limiter.MaxSoftShedDelay, args[1])
		}
		z.SoftShedMaxDelay = caddy.Duration(dur)
	}
	return nil
}

// unmarshalExempt adds the networks of an exempt line to list; several
// lines add up. A network that does not parse is reported at its line.
func unmarshalExempt(d *caddyfile.Dispenser, list *[]string) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return errors.New("exempt needs at least one IP address, CIDR network or private_ranges")
	}
	for _, a := range args {
		if a == privateRanges {
			continue
		}
		if _, err := parseNetwork(a); err != nil {
			return err
		}
	}
	*list = append(*list, args...)
	return nil
}

// positiveInt parses the setting name's positive integer, which must fit
// in bits bits.
func positiveInt(name, arg string, bits int) (int64, error) {
	n, err := strconv.ParseInt(arg, 10, min(bits, 64))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s must be a positive integer, got %q", name, arg)
	}
	return n, nil
}

// positiveDuration parses the setting name's positive Caddy duration.
func positiveDuration(name, arg string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(arg)
	if err != nil || dur <= 0 {
		return 0, fmt.Errorf("%s must be a positive duration, got %q", name, arg)
	}
	return caddy.Duration(dur), nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
