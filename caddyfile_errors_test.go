package fleetlimit_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// caddyfileLineRE finds the Caddyfile position in an error.
var caddyfileLineRE = regexp.MustCompile(`\bCaddyfile:(\d+)\b`)

// TestCaddyfileBadInput adapts each Caddyfile of badCaddyfiles, the one
// table of the directive's mistakes, and checks that it fails with an error
// that names the file and line of the mistake, says what is wrong, and
// shows no secret. The forms that adapt are golden files (see
// TestCaddyfileAdapt).
func TestCaddyfileBadInput(t *testing.T) {
	for _, tc := range badCaddyfiles {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkBadCaddyfile(t, tc.caddyfile, tc.line, tc.phrase)
		})
	}
}

// checkBadCaddyfile checks that a Caddyfile fails adaptation with an error
// that names its line alone, says phrase, and shows no secret.
func checkBadCaddyfile(t *testing.T, caddyfile string, line int, phrase string) {
	t.Helper()
	out, _, err := adaptCaddyfile(caddyfile)
	if err == nil {
		t.Fatalf("adapted without error:\n%s", out)
	}
	msg := err.Error()
	want := "Caddyfile:" + strconv.Itoa(line)
	m := caddyfileLineRE.FindAllStringSubmatch(msg, -1)
	if len(m) != 1 || m[0][0] != want {
		t.Errorf("error does not name %s alone:\n%s", want, msg)
	}
	if !strings.Contains(msg, phrase) {
		t.Errorf("error does not say %q:\n%s", phrase, msg)
	}
	if strings.Contains(msg, secret) {
		t.Errorf("error shows the redis password:\n%s", msg)
	}
}

// badCaddyfiles are Caddyfile mistakes, by kind of mistake and then by
// feature. Each must fail adaptation with an error naming the line of the
// mistake and saying what is wrong.
var badCaddyfiles = []struct {
	name      string
	caddyfile string
	line      int    // the line the error must name
	phrase    string // a phrase the error must contain
}{
	// Unknown subdirectives.
	{"unknown top level", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		limit 10
	}
}`, 6, `unknown subdirective "limit"`},
	{"unknown in zone", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			brust 20
		}
	}
}`, 5, `unknown subdirective "brust"`},
	{"unknown in redis", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			host 127.0.0.1
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `unknown redis subdirective "host"`},

	// Missing arguments.
	{"zone without name", `:80 {
	rate_limit {
		zone {
			rate 10 1s
		}
	}
}`, 3, "zone needs a name"},
	{"rate with one argument", `:80 {
	rate_limit {
		zone api {
			rate 10
		}
	}
}`, 4, "rate needs two arguments"},
	{"rate with three arguments", `:80 {
	rate_limit {
		zone api {
			rate 10 per 1s
		}
	}
}`, 4, "rate needs two arguments"},
	{"burst without argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			burst
		}
	}
}`, 5, "wrong argument count"},
	{"cost without argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			cost
		}
	}
}`, 5, "wrong argument count"},
	{"key without argument", `:80 {
	rate_limit {
		zone api {
			key
			rate 10 1s
		}
	}
}`, 4, "wrong argument count"},
	{"headers without argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		headers
	}
}`, 6, "wrong argument count"},
	{"redis address without argument", `:80 {
	rate_limit {
		redis {
			address
		}
		zone api {
			rate 10 1s
		}
	}
}`, 4, "wrong argument count"},

	// Extra arguments.
	{"burst with two arguments", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			burst 5 6
		}
	}
}`, 5, "wrong argument count"},
	{"log_key with an argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		log_key x
	}
}`, 6, "wrong argument count"},
	{"zone with two names", `:80 {
	rate_limit {
		zone a b {
			rate 10 1s
		}
	}
}`, 3, "wrong argument count"},
	{"headers with two modes", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		headers ietf legacy
	}
}`, 6, "wrong argument count"},
	{"directive with an argument", `:80 {
	rate_limit api {
		zone api {
			rate 10 1s
		}
	}
}`, 2, "wrong argument count"},
	{"redis with an argument", `:80 {
	rate_limit {
		redis 127.0.0.1:6379 {
		}
		zone api {
			rate 10 1s
		}
	}
}`, 3, "wrong argument count"},
	{"match with an argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			match POST {
				path /x
			}
		}
	}
}`, 5, "wrong argument count"},

	// Denial logs and jitter.
	{"unknown log_denials", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		log_denials warn
	}
}`, 6, `unknown log_denials "warn" (want info, debug or off)`},
	{"log_denials without argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		log_denials
	}
}`, 6, "wrong argument count"},
	{"jitter between a share and a percentage", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		jitter 1.01
	}
}`, 6, "jitter 1.01 is neither a share (0 to 1) nor a whole percentage (2 to 100)"},
	{"jitter fractional percentage without %", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		jitter 12.5
	}
}`, 6, "write a share (0.015) or, in the Caddyfile, a percentage (1.5%)"},
	{"jitter above 100%", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		jitter 150%
	}
}`, 6, `jitter percentage must be 0% to 100%, got "150%"`},
	{"jitter not a number", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		jitter some
	}
}`, 6, `got "some"`},

	// Key prefix.
	{"key_prefix with a hash tag", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			key_prefix rl{all}:
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `key_prefix must not hold braces`},
	{"key_prefix too long", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			key_prefix ` + strings.Repeat("p", 65) + `
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `key_prefix must be at most 64 bytes, got 65`},

	// Memory bound.
	{"max_keys zero", `:80 {
	rate_limit {
		max_keys 0
		zone api {
			rate 10 1s
		}
	}
}`, 3, `max_keys must be a positive integer, got "0"`},
	{"max_keys not a number", `:80 {
	rate_limit {
		max_keys lots
		zone api {
			rate 10 1s
		}
	}
}`, 3, `max_keys must be a positive integer, got "lots"`},
	{"max_wait not a duration", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			max_wait soon
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis max_wait must be a positive duration, got "soon"`},

	// Numbers.
	{"rate not a number", `:80 {
	rate_limit {
		zone api {
			rate ten 1s
		}
	}
}`, 4, `rate must be a positive integer, got "ten"`},
	{"rate zero", `:80 {
	rate_limit {
		zone api {
			rate 0 1s
		}
	}
}`, 4, `rate must be a positive integer, got "0"`},
	{"rate negative", `:80 {
	rate_limit {
		zone api {
			rate -5 1s
		}
	}
}`, 4, `rate must be a positive integer, got "-5"`},
	{"rate fractional", `:80 {
	rate_limit {
		zone api {
			rate 1.5 1s
		}
	}
}`, 4, `rate must be a positive integer, got "1.5"`},
	{"rate too large for JSON", `:80 {
	rate_limit {
		zone api {
			rate 9223372036854775807 1s
			burst 1
		}
	}
}`, 4, `rate must be at most 2^53`},
	{"burst not a number", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			burst lots
		}
	}
}`, 5, `burst must be a positive integer, got "lots"`},
	{"burst zero", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			burst 0
		}
	}
}`, 5, `burst must be a positive integer, got "0"`},
	{"burst negative", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			burst -1
		}
	}
}`, 5, `burst must be a positive integer, got "-1"`},
	{"cost not a number", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			cost two
		}
	}
}`, 5, `cost must be a positive integer or a placeholder, got "two"`},
	{"cost with a stray brace", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			cost "{header.X-Cost"
		}
	}
}`, 5, `cost "{header.X-Cost" is not a valid placeholder expression: '{' without '}'`},
	{"key with an empty placeholder", `:80 {
	rate_limit {
		zone api {
			key {header.X} x{}y
			rate 10 1s
		}
	}
}`, 4, `key "x{}y" is not a valid placeholder expression: empty placeholder {}`},
	{"cost zero", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			cost 0
		}
	}
}`, 5, `cost must be a positive integer or a placeholder, got "0"`},
	{"cost negative", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			cost -3
		}
	}
}`, 5, `cost must be a positive integer or a placeholder, got "-3"`},
	{"cost above explicit burst", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			burst 20
			cost 21
		}
	}
}`, 6, "cost 21 exceeds burst 20"},
	{"cost above explicit burst given later", `:80 {
	rate_limit {
		zone api {
			cost 21
			rate 10 1s
			burst 20
		}
	}
}`, 4, "cost 21 exceeds burst 20"},
	{"cost above default burst", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			cost 11
		}
	}
}`, 5, "cost 11 exceeds burst 10"},
	{"redis db not a number", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			db one
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis db must be a non-negative integer, got "one"`},
	{"redis db negative", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			db -1
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis db must be a non-negative integer, got "-1"`},

	{"redis db too large", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			db 9223372036854775807
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis db must be a non-negative integer`},

	// Durations.
	{"rate period not a duration", `:80 {
	rate_limit {
		zone api {
			rate 10 second
		}
	}
}`, 4, `rate period must be a positive duration, got "second"`},
	{"rate period zero", `:80 {
	rate_limit {
		zone api {
			rate 10 0s
		}
	}
}`, 4, `rate period must be a positive duration, got "0s"`},
	{"rate period negative", `:80 {
	rate_limit {
		zone api {
			rate 10 -1s
		}
	}
}`, 4, `rate period must be a positive duration, got "-1s"`},
	{"rate period below a microsecond", `:80 {
	rate_limit {
		zone api {
			burst 5
			rate 10 999ns
		}
	}
}`, 5, `zone "api": rate period must be at least one microsecond`},
	{"burst too large to count", `:80 {
	rate_limit {
		zone api {
			rate 1 8760h
			burst 1000000000
		}
	}
}`, 5, `zone "api": burst x refill time is too large`},
	{"redis timeout not a duration", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			timeout soon
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis timeout must be a positive duration, got "soon"`},
	{"redis timeout zero", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			timeout 0
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis timeout must be a positive duration, got "0"`},

	// Names, modes and keys.
	{"duplicate zone name", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		zone api {
			rate 100 1m
		}
	}
}`, 6, `zone "api" is defined twice`},
	{"zone name with a space", `:80 {
	rate_limit {
		zone "my zone" {
			rate 10 1s
		}
	}
}`, 3, `zone "my zone": name must be 1 to 64 letters`},
	{"zone name with a brace", `:80 {
	rate_limit {
		zone a}b {
			rate 10 1s
		}
	}
}`, 3, `zone "a}b": name must be 1 to 64 letters`},
	{"zone name too long", `:80 {
	rate_limit {
		zone ` + strings.Repeat("z", 65) + ` {
			rate 10 1s
		}
	}
}`, 3, "must be 1 to 64 letters"},
	{"unknown headers mode", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		headers draft
	}
}`, 6, `unknown headers mode "draft" (want ietf, legacy, both or none)`},
	{"empty key", `:80 {
	rate_limit {
		zone api {
			key ""
			rate 10 1s
		}
	}
}`, 4, "key expressions must not be empty"},
	{"empty key after a good one", `:80 {
	rate_limit {
		zone api {
			key {client_ip} ""
			rate 10 1s
		}
	}
}`, 4, "key expressions must not be empty"},

	// Missing parts.
	{"zone without rate", `:80 {
	rate_limit {
		zone api {
			burst 10
		}
	}
}`, 3, `zone "api": rate is required`},
	{"zone without block", `:80 {
	rate_limit {
		zone api
	}
}`, 3, `zone "api": rate is required`},
	{"no zone", `:80 {
	rate_limit {
		headers ietf
	}
}`, 2, "at least one zone is required"},
	{"no block", `:80 {
	rate_limit
}`, 2, "at least one zone is required"},
	{"redis without address", `:80 {
	rate_limit {
		redis {
			db 1
		}
		zone api {
			rate 10 1s
		}
	}
}`, 3, "redis: address is required"},
	{"sentinel without addresses", `:80 {
	rate_limit {
		redis {
			sentinel mymaster
		}
		zone api {
			rate 10 1s
		}
	}
}`, 4, "sentinel needs the master name and at least one sentinel address"},
	{"sentinel and address", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			sentinel m 127.0.0.1:26379
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, "redis: give either sentinels or server addresses, not both"},
	{"address twice", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			address 127.0.0.1:6380
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, "redis address given twice"},
	{"bad protocol", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			protocol 4
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis: protocol must be 2 or 3, got 4`},
	{"bad pool size", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			pool_size 0
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis pool_size must be a positive integer, got "0"`},
	{"bad pipelines", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			pipelines many
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis pipelines must be a positive integer, got "many"`},
	{"bad dial timeout", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			dial_timeout soon
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, `redis dial_timeout must be a positive duration, got "soon"`},
	{"tls cert without key", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			tls {
				cert /x.pem
			}
		}
		zone api {
			rate 10 1s
		}
	}
}`, 6, "redis: tls: a client certificate needs both cert and key"},
	{"unknown tls subdirective", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			tls {
				cipher x
			}
		}
		zone api {
			rate 10 1s
		}
	}
}`, 6, `unknown redis tls subdirective "cipher"`},
	{"sentinel password without argument", `:80 {
	rate_limit {
		redis {
			sentinel m 127.0.0.1:26379
			sentinel_password
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, "redis sentinel_password takes one argument"},
	{"two redis blocks", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
		}
		redis {
			address 127.0.0.1:6380
		}
		zone api {
			rate 10 1s
		}
	}
}`, 6, "only one redis block"},
	{"unknown matcher in zone", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			match {
				verb POST
			}
		}
	}
}`, 7, "module not registered: http.matchers.verb"}, // Caddy's matcher parser names the closing brace

	// Secrets stay out of errors, whatever the mistake next to them.
	{"password with two arguments", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			password ` + secret + ` ` + secret + `
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, "redis password takes one argument"},
	{"mistake after a password", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			username admin
			password ` + secret + `
			db x
		}
		zone api {
			rate 10 1s
		}
	}
}`, 7, "redis db must be"},
	{"db with cluster", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:7000
			cluster
			db 2
		}
		zone api {
			rate 10 1s
		}
	}
}`, 6, "redis: a Cluster has only db 0"},
	{"db with cluster nodes", `:80 {
	rate_limit {
		redis {
			db 2
			address 127.0.0.1:7000 127.0.0.1:7001
		}
		zone api {
			rate 10 1s
		}
	}
}`, 4, "redis: a Cluster has only db 0"},
	{"cluster and sentinel", `:80 {
	rate_limit {
		redis {
			sentinel m 127.0.0.1:26379
			cluster
		}
		zone api {
			rate 10 1s
		}
	}
}`, 5, "redis: cluster and sentinel exclude each other"},
	{"tls key without cert", `:80 {
	rate_limit {
		redis {
			address 127.0.0.1:6379
			tls {
				ca /ca.pem
				key /x.pem
			}
		}
		zone api {
			rate 10 1s
		}
	}
}`, 7, "redis: tls: a client certificate needs both cert and key"},
	{"ipv4 prefix too long", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			ipv4_prefix 33
		}
	}
}`, 5, `zone "api": ipv4_prefix must be 1 to 32, got 33`},
	{"unknown on_error", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			on_error retry
		}
	}
}`, 5, `zone "api": on_error must be allow, deny or local, got "retry"`},
	{"unknown algorithm", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			algorithm gcra
		}
	}
}`, 5, `zone "api": unknown algorithm "gcra"`},
	{"burst with a window algorithm", `:80 {
	rate_limit {
		zone api {
			algorithm fixed_window
			rate 10 1s
			burst 20
		}
	}
}`, 6, `zone "api": burst applies to token_bucket and leaky_bucket only`},
	{"duplicate zone after a good one", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		zone web {
			rate 10 1s
		}
		zone api {
			rate 5 1s
		}
	}
}`, 9, `zone "api" is defined twice`},

	// The dashboard's scope.
	{"dashboard scope value", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
	}
	rate_limit_dashboard {
		scope everything
	}
}`, 8, `scope must be server or all, got "everything"`},
	{"dashboard scope missing", `:80 {
	rate_limit_dashboard {
		scope
	}
}`, 3, `wrong argument count`},
	{"dashboard unknown subdirective", `:80 {
	rate_limit_dashboard {
		scoop all
	}
}`, 3, `unknown subdirective "scoop"`},

	// Policies: tiers, reserve, concurrency, count_status, ban, dry_run.
	{"rate placeholder without a period", `:80 {
	rate_limit {
		zone api {
			rate {plan_rate}
		}
	}
}`, 4, `rate needs two arguments: rate <n|placeholder> <duration>`},
	{"burst placeholder with a window", `:80 {
	rate_limit {
		zone api {
			algorithm sliding_window
			rate {plan_rate} 1m
			burst {plan_burst}
		}
	}
}`, 6, `burst applies to token_bucket and leaky_bucket only`},
	{"reserve of 100%", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			reserve 100%
		}
	}
}`, 5, `reserve must be a whole percentage from 0 to 99`},
	{"reserve not a number", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			reserve most
		}
	}
}`, 5, `reserve must be a whole percentage from 0 to 99`},
	{"concurrency without a limit", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
		}
	}
}`, 3, `a concurrency zone needs limit <n>`},
	{"concurrency with a rate", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
			limit 4
			rate 10 1s
		}
	}
}`, 6, `a concurrency zone takes limit <n>, not a rate`},
	{"concurrency with a reserve", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
			limit 4
			reserve 20
		}
	}
}`, 6, `reserve applies to the rate algorithms, not concurrency`},
	{"lease on a token bucket", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			lease 1m
		}
	}
}`, 5, `lease applies to the concurrency algorithm only`},
	{"limit on a token bucket", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			limit 4
		}
	}
}`, 5, `limit applies to algorithm concurrency only`},
	{"count_status of a bad code", `:80 {
	rate_limit {
		zone login {
			rate 5 15m
			count_status 4x1
		}
	}
}`, 5, `count_status takes status codes from 100 to 599 and classes 1xx to 5xx, got "4x1"`},
	{"count_status on a leaky bucket", `:80 {
	rate_limit {
		zone login {
			algorithm leaky_bucket
			rate 5 15m
			count_status 401
		}
	}
}`, 6, `count_status does not apply to leaky_bucket`},
	{"count_status on concurrency", `:80 {
	rate_limit {
		zone login {
			algorithm concurrency
			limit 3
			count_status 401
		}
	}
}`, 6, `count_status does not apply to concurrency`},
	{"ban without its words", `:80 {
	rate_limit {
		zone login {
			rate 5 15m
			ban 1h 10 15m
		}
	}
}`, 5, `ban takes: ban <duration> after <n> in <window>`},
	{"ban after zero denials", `:80 {
	rate_limit {
		zone login {
			rate 5 15m
			ban 1h after 0 in 15m
		}
	}
}`, 5, `ban denials must be a positive integer`},
	{"dry_run with an argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			dry_run yes
		}
	}
}`, 5, `wrong argument count`},

	// Quotas.
	{"quota not a number", `:80 {
	rate_limit {
		zone api {
			quota lots per month
		}
	}
}`, 4, `quota must be a positive integer, got "lots"`},
	{"quota of zero", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			quota 0 per day
		}
	}
}`, 5, `quota must be a positive integer, got "0"`},
	{"quota too large", `:80 {
	rate_limit {
		zone api {
			quota 2000000000000 per day
		}
	}
}`, 4, `quota must be at most 2^40 per period`},
	{"quota of a year", `:80 {
	rate_limit {
		zone api {
			quota 10 per year
		}
	}
}`, 4, `unknown quota period "year" (want day, week or month)`},
	{"quota without per", `:80 {
	rate_limit {
		zone api {
			quota 10 month
		}
	}
}`, 4, `quota takes: quota <n|placeholder> per day|week|month [tz <IANA zone>]`},
	{"quota in an unknown zone", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			quota 10000 per month tz Europe/Atlantis
		}
	}
}`, 5, `unknown quota time zone "Europe/Atlantis"`},
	{"quota in the node's zone", `:80 {
	rate_limit {
		zone api {
			quota 10000 per month tz Local
		}
	}
}`, 4, `quota time zone "Local" would differ between nodes`},
	{"quota tz without a zone", `:80 {
	rate_limit {
		zone api {
			quota 10000 per month tz
		}
	}
}`, 4, `quota takes: quota <n|placeholder> per day|week|month [tz <IANA zone>]`},
	{"quota only, with a burst", `:80 {
	rate_limit {
		zone api {
			quota 100 per day
			burst 5
		}
	}
}`, 5, `a zone with only a quota takes no burst`},
	{"quota only, with an algorithm", `:80 {
	rate_limit {
		zone api {
			algorithm sliding_window
			quota 100 per day
		}
	}
}`, 4, `a zone with only a quota takes no algorithm`},
	{"cost above the quota", `:80 {
	rate_limit {
		zone api {
			rate 100 1s
			quota 10 per day
			cost 20
		}
	}
}`, 5, `cost 20 exceeds quota 10`},
	{"quota's name taken", `:80 {
	rate_limit {
		zone api {
			rate 100 1s
			quota 10 per day
		}
		zone api.quota {
			rate 1 1s
		}
	}
}`, 3, `its quota is reported as zone "api.quota", the name of another zone`},

	// soft_shed and its waiting room.
	{"percent of 100", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed 100
		}
	}
}`, 5, `soft_shed must be a whole percentage from 1 to 99, got "100"`},
	{"percent of 0", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed 0%
		}
	}
}`, 5, `soft_shed must be a whole percentage from 1 to 99, got "0%"`},
	{"percent not a number", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed most 1s
		}
	}
}`, 5, `soft_shed must be a whole percentage from 1 to 99, got "most"`},
	{"bad max delay", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed 80 soon
		}
	}
}`, 5, `soft_shed's max delay must be a positive duration of at most 1h0m0s, got "soon"`},
	{"max delay over an hour", `:80 {
	rate_limit {
		zone api {
			rate 10 1s

			soft_shed 80 2h
		}
	}
}`, 6, `soft_shed's max delay must be a positive duration of at most 1h0m0s, got "2h"`},
	{"no arguments", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed
		}
	}
}`, 5, `soft_shed takes: soft_shed <percent> [<max_delay>]`},
	{"on a leaky bucket", `:80 {
	rate_limit {
		zone api {
			algorithm leaky_bucket
			rate 10 1s
			soft_shed 80
		}
	}
}`, 6, `soft_shed applies to token_bucket only`},
	{"on a sliding window, before the algorithm", `:80 {
	rate_limit {
		zone api {
			soft_shed 80 1s
			rate 10 1m
			algorithm sliding_window
		}
	}
}`, 4, `soft_shed applies to token_bucket only`},
	{"on caddy-ratelimit's form", `:80 {
	rate_limit {
		zone api {
			window 1m
			events 10
			soft_shed 50
		}
	}
}`, 6, `soft_shed applies to token_bucket only`},
	{"on concurrency", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
			limit 4
			soft_shed 50
		}
	}
}`, 6, `soft_shed applies to token_bucket only`},
	{"on a quota alone", `:80 {
	rate_limit {
		zone api {
			quota 1000 per day
			soft_shed 50
		}
	}
}`, 5, `soft_shed applies to token_bucket only`},
	{"max_waiting on a plain token bucket", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			max_waiting 10
		}
	}
}`, 5, `max_waiting applies to leaky_bucket and soft_shed zones only`},

	// cost_header.
	{"no header name", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header
		}
	}
}`, 5, `zone "llm": cost_header takes one response header name, then optionally what a request pays when its response ends before reporting its cost: cost_header <header> [abort <n>]`},
	{"two names", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens-Used X-Other
		}
	}
}`, 5, `cost_header takes one response header name`},
	{"abort without a number", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens-Used abort
		}
	}
}`, 5, `cost_header <header> [abort <n>]`},
	{"abort 0", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens-Used abort 0
		}
	}
}`, 5, `zone "llm": cost_header's abort takes a positive whole number of tokens, got "0"`},
	{"abort not a number", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens-Used abort lots
		}
	}
}`, 5, `cost_header's abort takes a positive whole number of tokens, got "lots"`},
	{"not abort", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens-Used max 300
		}
	}
}`, 5, `cost_header <header> [abort <n>]`},
	{"not a field name", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens:Used
		}
	}
}`, 5, `zone "llm": cost_header "X-Tokens:Used" is not a header field name`},
	{"sliding window", `:80 {
	rate_limit {
		zone llm {
			algorithm sliding_window
			rate 1000 1m
			cost_header X-Tokens-Used
		}
	}
}`, 6, `cost_header applies to token_bucket zones and quotas only, not sliding_window`},
	{"caddy-ratelimit form", `:80 {
	rate_limit {
		zone llm {
			window 1m
			events 1000
			cost_header X-Tokens-Used
		}
	}
}`, 6, `cost_header applies to token_bucket zones and quotas only, not sliding_log`},
	{"concurrency", `:80 {
	rate_limit {
		zone llm {
			algorithm concurrency
			limit 4
			cost_header X-Tokens-Used
		}
	}
}`, 6, `cost_header applies to token_bucket zones and quotas only, not concurrency`},

	// Exemptions.
	{"handler", `:80 {
	rate_limit {
		exempt 10.0.0.0/8
		exempt 10.0.0.300
		zone api {
			rate 10 1s
		}
	}
}`, 4, `exempt: "10.0.0.300" is not an IP address or CIDR network`},
	{"zone", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			exempt 192.0.2.0/24
			exempt 2001:db8::/129
		}
	}
}`, 6, `zone "api": exempt: "2001:db8::/129" is not an IP address or CIDR network`},
	{"handler without an argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
		}
		exempt
	}
}`, 6, `exempt needs at least one IP address`},
	{"zone hostname", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			exempt localhost
		}
	}
}`, 5, `"localhost" is not an IP address`},
}
