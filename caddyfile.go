package fleetlimit

import (
	"strconv"
	"strings"
	"time"

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
//	        cost  <n|placeholder>
//	        on_error allow|deny|local
//	        fleet_size <n>
//	        match { <matchers> }
//	    }
//	    headers ietf|legacy|both|none
//	    log_key
//	}
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
		default:
			return d.Errf("unknown subdirective %q (want redis, zone, headers or log_key)", d.Val())
		}
	}
	if len(h.Zones) == 0 {
		return start.Err("rate_limit needs at least one zone")
	}
	return nil
}

// redisSubdirectives lists the redis block's subdirectives, for errors.
const redisSubdirectives = "address, cluster, sentinel, sentinel_username, sentinel_password, username, password, db, tls, " +
	"pool_size, dial_timeout, timeout, protocol, disable_identity, key_prefix, breaker_failures, breaker_cooldown or deny_cache_size"

func (c *RedisConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
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
			continue
		case "sentinel":
			args := d.RemainingArgs()
			if len(args) < 2 {
				return d.Err("redis sentinel needs the master name and at least one sentinel address: sentinel <master_name> <addr>...")
			}
			c.SentinelMaster, c.SentinelAddresses = args[0], args[1:]
			continue
		case "cluster", "disable_identity":
			if d.NextArg() {
				return d.ArgErr()
			}
			if sub == "cluster" {
				c.Cluster = true
			} else {
				c.DisableIdentity = true
			}
			continue
		case "tls":
			if c.TLS != nil {
				return d.Err("redis: only one tls block is allowed")
			}
			c.TLS = new(RedisTLS)
			if err := c.TLS.unmarshalCaddyfile(d); err != nil {
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
		case "timeout", "dial_timeout", "breaker_cooldown":
			dur, err := caddy.ParseDuration(arg)
			if err != nil || dur <= 0 {
				return d.Errf("redis %s must be a positive duration, got %q", sub, arg)
			}
			switch sub {
			case "timeout":
				c.Timeout = caddy.Duration(dur)
			case "dial_timeout":
				c.DialTimeout = caddy.Duration(dur)
			default:
				c.BreakerCooldown = caddy.Duration(dur)
			}
		case "pool_size", "breaker_failures", "deny_cache_size":
			n, err := strconv.ParseInt(arg, 10, 32)
			if err != nil || n <= 0 {
				return d.Errf("redis %s must be a positive integer, got %q", sub, arg)
			}
			switch sub {
			case "pool_size":
				c.PoolSize = int(n)
			case "breaker_failures":
				c.BreakerFailures = int(n)
			default:
				c.DenyCacheSize = int(n)
			}
		default:
			return d.Errf("unknown redis subdirective %q (want %s)", sub, redisSubdirectives)
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
	var costLine caddyfile.Dispenser // where cost was given, for a late error
	var rateLine caddyfile.Dispenser // where rate was given, likewise
	var costSet bool
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "key":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, a := range args {
				if strings.TrimSpace(a) == "" {
					return d.Errf("zone %q: empty key expression", z.Name)
				}
				if err := checkPlaceholders(a); err != nil {
					return d.Errf("zone %q: key %q is not a valid placeholder expression: %v", z.Name, a, err)
				}
			}
			z.Key = args
		case "rate":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("zone %q: rate needs two arguments: rate <n> <duration>", z.Name)
			}
			n, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || n <= 0 {
				return d.Errf("zone %q: rate must be a positive integer, got %q", z.Name, args[0])
			}
			if n > 1<<53 { // the adapter's JSON goes through float64
				return d.Errf("zone %q: rate must be at most 2^53, got %q", z.Name, args[0])
			}
			dur, err := caddy.ParseDuration(args[1])
			if err != nil || dur <= 0 {
				return d.Errf("zone %q: rate period must be a positive duration, got %q", z.Name, args[1])
			}
			z.Rate, z.Per = n, caddy.Duration(dur)
			rateLine = *d
		case "burst":
			var arg string
			if !d.AllArgs(&arg) {
				return d.ArgErr()
			}
			n, err := strconv.ParseInt(arg, 10, 64)
			if err != nil || n <= 0 {
				return d.Errf("zone %q: burst must be a positive integer, got %q", z.Name, arg)
			}
			z.Burst = n
		case "cost":
			var arg string
			if !d.AllArgs(&arg) {
				return d.ArgErr()
			}
			if strings.ContainsAny(arg, "{}") {
				if err := checkPlaceholders(arg); err != nil {
					return d.Errf("zone %q: cost %q is not a valid placeholder expression: %v", z.Name, arg, err)
				}
			} else {
				n, err := strconv.ParseInt(arg, 10, 64)
				if err != nil || n <= 0 {
					return d.Errf("zone %q: cost must be a positive integer or a placeholder, got %q", z.Name, arg)
				}
			}
			z.Cost, costSet = arg, true
			costLine = *d
		case "on_error":
			var arg string
			if !d.AllArgs(&arg) {
				return d.ArgErr()
			}
			if _, err := limiter.ParsePolicy(arg); err != nil {
				return d.Errf("zone %q: on_error must be allow, deny or local, got %q", z.Name, arg)
			}
			z.OnError = arg
		case "fleet_size":
			var arg string
			if !d.AllArgs(&arg) {
				return d.ArgErr()
			}
			n, err := strconv.ParseInt(arg, 10, 32)
			if err != nil || n <= 0 {
				return d.Errf("zone %q: fleet_size must be a positive integer, got %q", z.Name, arg)
			}
			z.FleetSize = n
		case "match":
			if d.NextArg() {
				return d.ArgErr()
			}
			set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return err
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
		default:
			return d.Errf("zone %q: unknown subdirective %q (want key, rate, burst, cost, on_error, fleet_size or match)", z.Name, d.Val())
		}
	}
	if z.Rate == 0 {
		return start.Errf("zone %q: rate is required: rate <n> <duration>", z.Name)
	}
	// The checks provisioning makes, so that they come with a line here.
	rule, err := limiter.NewRule(z.Name, z.Rate, time.Duration(z.Per), z.Burst)
	if err != nil {
		return rateLine.Errf("zone %q: %v", z.Name, err)
	}
	burst := rule.Burst
	if costSet && !strings.Contains(z.Cost, "{") {
		if n, _ := strconv.ParseInt(z.Cost, 10, 64); n > burst {
			return costLine.Errf("zone %q: cost %d exceeds burst %d, so no request could ever pass", z.Name, n, burst)
		}
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
