package fleetlimit

import (
	"encoding/json"
	"errors"
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
//	        deny_cache_size <n>
//	        breaker_failures <n>
//	        breaker_cooldown <duration>
//	    }
//	    zone <name> {
//	        key   <expr> [<expr>...]
//	        rate  <n> <duration>
//	        burst <n>
//	        algorithm token_bucket|sliding_window|fixed_window|sliding_log|leaky_bucket
//	        max_delay <duration>
//	        window <duration>  events <n>    # caddy-ratelimit's form
//	        ipv4_prefix <bits>  ipv6_prefix <bits>
//	        cost  <n|placeholder>
//	        on_error allow|deny|local
//	        fleet_size <n>
//	        match { <matchers> }
//	    }
//	    headers ietf|legacy|both|none
//	    log_key
//	    log_denials info|debug|off
//	    disable_metrics
//	    max_keys <n>
//	    jitter <share|percent|percent%>   # 0.2, 20 and 20% all mean up to 20%
//	    sweep_interval <duration>
//	    distributed { ... }               # caddy-ratelimit's; ignored
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
	for d.NextBlock(0) {
		switch d.Val() {
		case "redis":
			if h.Redis != nil {
				return d.Err("redis: only one redis block is allowed")
			}
			h.Redis = new(RedisConfig)
			if err := h.Redis.unmarshalCaddyfile(d); err != nil {
				return err
			}
		case "zone":
			at := *d
			z := new(Zone)
			if err := z.unmarshalCaddyfile(d); err != nil {
				return err
			}
			for _, other := range h.Zones {
				if other.Name == z.Name {
					return at.Errf("zone %q is defined twice", z.Name)
				}
			}
			h.Zones = append(h.Zones, z)
		case "headers":
			var mode string
			if !d.AllArgs(&mode) {
				return d.ArgErr()
			}
			if _, err := parseHeaderMode(mode); err != nil {
				return d.Errf("unknown headers mode %q (want ietf, legacy, both or none)", mode)
			}
			h.Headers = mode
		case "log_key":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.LogKey = true
		case "key_digest_secret":
			if !d.AllArgs(&h.KeyDigestSecret) {
				return d.Err("key_digest_secret takes one argument")
			}
		case "disable_metrics":
			if d.NextArg() {
				return d.ArgErr()
			}
			h.DisableMetrics = true
		case "log_denials":
			var level string
			if !d.AllArgs(&level) {
				return d.ArgErr()
			}
			if _, err := parseDenialLevel(level); err != nil {
				return d.Errf("unknown log_denials %q (want info, debug or off)", level)
			}
			h.LogDenials = level
		case "max_keys":
			var arg string
			if !d.AllArgs(&arg) {
				return d.ArgErr()
			}
			n, err := strconv.ParseInt(arg, 10, 32)
			if err != nil || n <= 0 {
				return d.Errf("max_keys must be a positive integer, got %q", arg)
			}
			h.MaxKeys = int(n)
		default:
			if err := h.unmarshalCompat(d); err != nil {
				return err
			}
		}
	}
	if len(h.Zones) == 0 {
		return start.Err("rate_limit needs at least one zone")
	}
	return nil
}

// unmarshalCompat sets up caddy-ratelimit's options, which fleetlimit
// accepts so that that plugin's Caddyfiles load, and reports any other
// subdirective as unknown.
func (h *Handler) unmarshalCompat(d *caddyfile.Dispenser) error {
	switch d.Val() {
	case "jitter":
		var arg string
		if !d.AllArgs(&arg) {
			return d.ArgErr()
		}
		j, err := parseJitter(arg)
		if err != nil {
			return d.Err(err.Error())
		}
		h.Jitter = j
	case "sweep_interval":
		var arg string
		if !d.AllArgs(&arg) {
			return d.ArgErr()
		}
		dur, err := caddy.ParseDuration(arg)
		if err != nil || dur <= 0 {
			return d.Errf("sweep_interval must be a positive duration, got %q", arg)
		}
		h.SweepInterval = caddy.Duration(dur)
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
			dur, err := caddy.ParseDuration(arg)
			if err != nil || dur <= 0 {
				return d.Errf("distributed %s must be a positive duration, got %q", sub, arg)
			}
			switch sub {
			case "read_interval":
				h.Distributed.ReadInterval = caddy.Duration(dur)
			case "write_interval":
				h.Distributed.WriteInterval = caddy.Duration(dur)
			case "purge_age":
				h.Distributed.PurgeAge = caddy.Duration(dur)
			default:
				return d.Errf("unknown distributed subdirective %q (want read_interval, write_interval or purge_age)", sub)
			}
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
	default:
		return d.Errf("unknown subdirective %q (want redis, zone, headers, log_key, key_digest_secret, log_denials, disable_metrics, max_keys, jitter, sweep_interval, distributed or storage)", d.Val())
	}
	return nil
}

// redisSubdirectives lists the redis block's subdirectives, for errors.
const redisSubdirectives = "address, cluster, sentinel, sentinel_username, sentinel_password, username, password, db, tls, " +
	"pool_size, pipelines, dial_timeout, timeout, max_wait, protocol, disable_identity, key_prefix, breaker_failures, breaker_cooldown or deny_cache_size"

func (c *RedisConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if handled, err := c.unmarshalServers(d, sub); handled || err != nil {
			if err != nil {
				return err
			}
			continue
		}
		var arg string
		if !d.AllArgs(&arg) {
			if sub == "password" || sub == "sentinel_password" {
				// ArgErr would quote the password.
				return d.Errf("redis %s takes one argument (quote it if it has spaces)", sub)
			}
			return d.ArgErr()
		}
		if err := c.unmarshalSetting(d, sub, arg); err != nil {
			return err
		}
	}
	switch {
	case c.Address == "" && len(c.Addresses) == 0 && c.SentinelMaster == "":
		return start.Err("redis block needs an address (or several for a Cluster, or sentinel <master> <addr>...)")
	case c.SentinelMaster != "" && (c.Address != "" || len(c.Addresses) > 0):
		return start.Err("redis block has both sentinel and address: sentinels find the master")
	case c.Cluster && c.SentinelMaster != "":
		return start.Err("redis block has both cluster and sentinel")
	}
	return nil
}

// unmarshalServers sets up the redis subdirectives that do not take
// exactly one argument: where the servers are, how to reach them (tls)
// and the flags. It reports false for any other subdirective.
func (c *RedisConfig) unmarshalServers(d *caddyfile.Dispenser, sub string) (bool, error) {
	switch sub {
	case "address":
		addrs := d.RemainingArgs()
		if len(addrs) == 0 {
			return true, d.ArgErr()
		}
		if c.Address != "" || len(c.Addresses) > 0 {
			return true, d.Err("redis address given twice (list every Cluster node on one address line)")
		}
		if len(addrs) == 1 {
			c.Address = addrs[0]
		} else {
			c.Addresses = addrs
		}
	case "sentinel":
		args := d.RemainingArgs()
		if len(args) < 2 {
			return true, d.Err("redis sentinel needs the master name and at least one sentinel address: sentinel <master_name> <addr>...")
		}
		c.SentinelMaster, c.SentinelAddresses = args[0], args[1:]
	case "cluster", "disable_identity":
		if d.NextArg() {
			return true, d.ArgErr()
		}
		if sub == "cluster" {
			c.Cluster = true
		} else {
			c.DisableIdentity = true
		}
	case "tls":
		if c.TLS != nil {
			return true, d.Err("redis: only one tls block is allowed")
		}
		c.TLS = new(RedisTLS)
		return true, c.TLS.unmarshalCaddyfile(d)
	default:
		return false, nil
	}
	return true, nil
}

// unmarshalSetting sets up a redis subdirective that takes one argument.
func (c *RedisConfig) unmarshalSetting(d *caddyfile.Dispenser, sub, arg string) error {
	switch sub {
	case "username":
		c.Username = arg
	case "password":
		c.Password = arg
	case "sentinel_username":
		c.SentinelUsername = arg
	case "sentinel_password":
		c.SentinelPassword = arg
	case "db":
		n, err := strconv.ParseInt(arg, 10, 32)
		if err != nil || n < 0 {
			return d.Errf("redis db must be a non-negative integer, got %q", arg)
		}
		c.DB = int(n)
	case "key_prefix":
		c.KeyPrefix = arg
	case "protocol":
		if arg != "2" && arg != "3" {
			return d.Errf("redis protocol must be 2 or 3, got %q", arg)
		}
		c.Protocol, _ = strconv.Atoi(arg)
	case "timeout", "max_wait", "dial_timeout", "breaker_cooldown":
		dur, err := caddy.ParseDuration(arg)
		if err != nil || dur <= 0 {
			return d.Errf("redis %s must be a positive duration, got %q", sub, arg)
		}
		switch sub {
		case "timeout":
			c.Timeout = caddy.Duration(dur)
		case "max_wait":
			c.MaxWait = caddy.Duration(dur)
		case "dial_timeout":
			c.DialTimeout = caddy.Duration(dur)
		default:
			c.BreakerCooldown = caddy.Duration(dur)
		}
	case "pool_size", "pipelines", "breaker_failures", "deny_cache_size":
		n, err := strconv.ParseInt(arg, 10, 32)
		if err != nil || n <= 0 {
			return d.Errf("redis %s must be a positive integer, got %q", sub, arg)
		}
		switch sub {
		case "pool_size":
			c.PoolSize = int(n)
		case "pipelines":
			c.Pipelines = int(n)
		case "breaker_failures":
			c.BreakerFailures = int(n)
		default:
			c.DenyCacheSize = int(n)
		}
	default:
		return d.Errf("unknown redis subdirective %q (want %s)", sub, redisSubdirectives)
	}
	return nil
}

func (t *RedisTLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if sub == "insecure_skip_verify" {
			if d.NextArg() {
				return d.ArgErr()
			}
			t.InsecureSkipVerify = true
			continue
		}
		var arg string
		if !d.AllArgs(&arg) {
			return d.ArgErr()
		}
		switch sub {
		case "ca":
			t.CA = arg
		case "cert":
			t.Cert = arg
		case "key":
			t.Key = arg
		case "server_name":
			t.ServerName = arg
		default:
			return d.Errf("unknown redis tls subdirective %q (want ca, cert, key, server_name or insecure_skip_verify)", sub)
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return d.Err("redis tls needs both cert and key for a client certificate")
	}
	return nil
}

func (z *Zone) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if !d.NextArg() {
		return d.Err("zone needs a name: zone <name> { ... }")
	}
	z.Name = d.Val()
	if !zoneNameRE.MatchString(z.Name) {
		return d.Errf("zone name %q must be 1 to 64 letters, digits, '_', '-' or '.'", z.Name)
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	var lines zoneLines
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if handled, err := z.unmarshalList(d, sub, &lines); handled || err != nil {
			if err != nil {
				return err
			}
			continue
		}
		// The rest take exactly one argument.
		var arg string
		if !d.AllArgs(&arg) {
			return d.ArgErr()
		}
		if err := z.unmarshalSetting(d, sub, arg, &lines); err != nil {
			return err
		}
	}
	return z.checkCaddyfile(start, lines)
}

// zoneLines are where a zone block gave its limit and its cost, so that
// the checks made after the block report the line of the setting at fault.
type zoneLines struct {
	rule    caddyfile.Dispenser // where the rule was last given
	cost    caddyfile.Dispenser // where cost was given
	costSet bool
}

// unmarshalList sets up the zone subdirectives that do not take exactly
// one argument: key, rate and match. It reports false for any other.
func (z *Zone) unmarshalList(d *caddyfile.Dispenser, sub string, lines *zoneLines) (bool, error) {
	switch sub {
	case "key":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return true, d.ArgErr()
		}
		for _, a := range args {
			if strings.TrimSpace(a) == "" {
				return true, d.Errf("zone %q: empty key expression", z.Name)
			}
			if err := checkPlaceholders(a); err != nil {
				return true, d.Errf("zone %q: key %q is not a valid placeholder expression: %v", z.Name, a, err)
			}
		}
		z.Key = args
	case "rate":
		args := d.RemainingArgs()
		if len(args) != 2 {
			return true, d.Errf("zone %q: rate needs two arguments: rate <n> <duration>", z.Name)
		}
		n, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil || n <= 0 {
			return true, d.Errf("zone %q: rate must be a positive integer, got %q", z.Name, args[0])
		}
		if n > 1<<53 { // the adapter's JSON goes through float64
			return true, d.Errf("zone %q: rate must be at most 2^53, got %q", z.Name, args[0])
		}
		dur, err := caddy.ParseDuration(args[1])
		if err != nil || dur <= 0 {
			return true, d.Errf("zone %q: rate period must be a positive duration, got %q", z.Name, args[1])
		}
		z.Rate, z.Per = n, caddy.Duration(dur)
		lines.rule = *d
	case "match":
		if d.NextArg() {
			return true, d.ArgErr()
		}
		set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
		if err != nil {
			return true, err
		}
		z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
	default:
		return false, nil
	}
	return true, nil
}

// unmarshalSetting sets up a zone subdirective that takes one argument.
func (z *Zone) unmarshalSetting(d *caddyfile.Dispenser, sub, arg string, lines *zoneLines) error {
	var err error
	switch sub {
	case "burst":
		z.Burst, err = positiveInt(arg, 64)
		lines.rule = *d
	case "fleet_size":
		z.FleetSize, err = positiveInt(arg, 32)
	case "events":
		z.Events, err = positiveInt(arg, 54)
		lines.rule = *d
	case "max_delay":
		z.MaxDelay, err = positiveDuration(arg)
		lines.rule = *d
	case "window":
		z.Window, err = positiveDuration(arg)
		lines.rule = *d
	case "cost":
		if strings.ContainsAny(arg, "{}") {
			if perr := checkPlaceholders(arg); perr != nil {
				return d.Errf("zone %q: cost %q is not a valid placeholder expression: %v", z.Name, arg, perr)
			}
		} else if _, err = positiveInt(arg, 64); err != nil {
			return d.Errf("zone %q: cost must be a positive integer or a placeholder, got %q", z.Name, arg)
		}
		z.Cost, lines.costSet, lines.cost = arg, true, *d
	case "on_error":
		if _, perr := limiter.ParsePolicy(arg); perr != nil {
			return d.Errf("zone %q: on_error must be allow, deny or local, got %q", z.Name, arg)
		}
		z.OnError = arg
	case "algorithm":
		if _, aerr := limiter.ParseAlgorithm(arg); aerr != nil {
			return d.Errf("zone %q: %v", z.Name, aerr)
		}
		z.Algorithm, lines.rule = arg, *d
	case "ipv4_prefix", "ipv6_prefix":
		return z.unmarshalPrefix(d, sub, arg)
	default:
		return d.Errf("zone %q: unknown subdirective %q (want key, algorithm, rate, burst, max_delay, window, events, cost, on_error, fleet_size, ipv4_prefix, ipv6_prefix or match)", z.Name, sub)
	}
	if err != nil {
		return d.Errf("zone %q: %s %v, got %q", z.Name, sub, err, arg)
	}
	return nil
}

// unmarshalPrefix sets up ipv4_prefix or ipv6_prefix.
func (z *Zone) unmarshalPrefix(d *caddyfile.Dispenser, sub, arg string) error {
	bits := int64(32)
	if sub == "ipv6_prefix" {
		bits = 128
	}
	n, err := positiveInt(arg, 32)
	if err != nil || n > bits {
		return d.Errf("zone %q: %s must be 1 to %d, got %q", z.Name, sub, bits, arg)
	}
	if sub == "ipv4_prefix" {
		z.IPv4Prefix = int(n)
	} else {
		z.IPv6Prefix = int(n)
	}
	return nil
}

// checkCaddyfile makes the checks of a whole zone block that provisioning
// would make, so that they come with a line of the Caddyfile: start is the
// zone's own line.
func (z *Zone) checkCaddyfile(start caddyfile.Dispenser, lines zoneLines) error {
	if z.Rate == 0 && z.Events == 0 && z.Window == 0 {
		return start.Errf("zone %q: rate is required: rate <n> <duration> (or window <duration> and events <n>)", z.Name)
	}
	ruleLine := lines.rule
	if ruleLine.Line() == 0 {
		ruleLine = start
	}
	rule, err := z.compileRule()
	if err != nil {
		return ruleLine.Errf("zone %q: %v", z.Name, err)
	}
	if lines.costSet && !strings.Contains(z.Cost, "{") {
		if n, _ := strconv.ParseInt(z.Cost, 10, 64); n > rule.Burst {
			return lines.cost.Errf("zone %q: cost %d exceeds burst %d, so no request could ever pass", z.Name, n, rule.Burst)
		}
	}
	return nil
}

// errNotPositiveInt and errNotPositiveDuration complete "zone %q: <sub> ...".
var (
	errNotPositiveInt      = errors.New("must be a positive integer")
	errNotPositiveDuration = errors.New("must be a positive duration")
)

// positiveInt parses a positive integer that fits in bits bits.
func positiveInt(arg string, bits int) (int64, error) {
	n, err := strconv.ParseInt(arg, 10, min(bits, 64))
	if err != nil || n <= 0 {
		return 0, errNotPositiveInt
	}
	return n, nil
}

// positiveDuration parses a positive Caddy duration.
func positiveDuration(arg string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(arg)
	if err != nil || dur <= 0 {
		return 0, errNotPositiveDuration
	}
	return caddy.Duration(dur), nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
