package fleetlimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"

	// The standard modules: the http app, matchers, basic_auth, respond...
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
)

// Regenerate the golden files' JSON with
//
//	go test -run TestCaddyfileAdapt -update-caddytest .
//
// and read the diff before committing it.
var updateCaddytest = flag.Bool("update-caddytest", false, "rewrite the expected JSON of testdata/caddyfile/*.caddytest")

const goldenDir = "testdata/caddyfile"

// goldenSeparator is the line between a golden file's Caddyfile and its JSON.
const goldenSeparator = "\n----------\n"

// secret is a Redis password that no error message may ever show.
const secret = "hunter2-Zq9"

// TestCaddyfileAdapt adapts every testdata/caddyfile/*.caddytest file and
// compares the result with the JSON below its `----------` line. The files
// double as the directive's reference: one per form. Every rate_limit handler
// of the result must also provision, so the examples are valid at run time
// too, not only well formed.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.caddytest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no golden files in %s", goldenDir)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".caddytest"), func(t *testing.T) {
			caddyfile, expected := readGolden(t, file)
			if *updateCaddytest {
				expected = writeGolden(t, file, caddyfile)
			}
			if !caddytest.CompareAdapt(t, file, caddyfile, "caddyfile", expected) {
				t.Errorf("%s: the adapted JSON differs from the expected JSON (diff above)", file)
			}

			out, warnings, err := adaptCaddyfile(caddyfile)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range warnings {
				t.Errorf("%s:%d: warning: %s", file, w.Line, w.Message)
			}
			handlers := rateLimitHandlers(t, out)
			if len(handlers) == 0 {
				t.Fatal("the adapted config has no rate_limit handler")
			}
			for i, raw := range handlers {
				if err := provisionHandler(raw); err != nil {
					t.Errorf("rate_limit handler %d does not provision: %v\n%s", i, err, raw)
				}
			}
		})
	}
}

// TestCaddyfileExample keeps the repository's example adaptable.
func TestCaddyfileExample(t *testing.T) {
	body, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := adaptCaddyfile(string(body))
	if err != nil {
		t.Fatalf("Caddyfile.example: %v", err)
	}
	for i, raw := range rateLimitHandlers(t, out) {
		if err := provisionHandler(raw); err != nil {
			t.Errorf("Caddyfile.example: rate_limit handler %d does not provision: %v", i, err)
		}
	}
}

// badCaddyfiles are Caddyfile mistakes. Each must fail adaptation with an
// error naming the line of the mistake and saying what is wrong.
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
}

// caddyfileLineRE finds the Caddyfile position in an error.
var caddyfileLineRE = regexp.MustCompile(`\bCaddyfile:(\d+)\b`)

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

// TestBadJSONProvision checks that the JSON config, which a user may write
// without the Caddyfile's checks, is refused at provisioning with a message
// that says what is wrong.
func TestBadJSONProvision(t *testing.T) {
	cases := []struct {
		name   string
		json   string
		phrase string
	}{
		{"no zones", `{}`, "at least one zone is required"},
		{"negative max_keys", `{"max_keys":-1,"zones":[{"name":"a","rate":10,"per":1000000000}]}`, "max_keys must not be negative"},
		{"null zone", `{"zones":[null]}`, "zone 0 is empty"},
		{"cost above burst", `{"zones":[{"name":"a","rate":10,"per":1000000000,"burst":20,"cost":"21"}]}`,
			`zone "a": cost 21 exceeds burst 20`},
		{"cost above default burst", `{"zones":[{"name":"a","rate":10,"per":1000000000,"cost":"11"}]}`,
			`zone "a": cost 11 exceeds burst 10`},
		{"negative cost", `{"zones":[{"name":"a","rate":10,"per":1000000000,"cost":"-1"}]}`,
			`cost must be a positive integer or a placeholder`},
		{"zero cost", `{"zones":[{"name":"a","rate":10,"per":1000000000,"cost":"0"}]}`,
			`cost must be a positive integer or a placeholder`},
		{"cost not a number", `{"zones":[{"name":"a","rate":10,"per":1000000000,"cost":"many"}]}`,
			`cost must be a positive integer or a placeholder`},
		{"cost with a stray brace", `{"zones":[{"name":"a","rate":10,"per":1000000000,"cost":"5{"}]}`,
			`zone "a": cost "5{" is not a valid placeholder expression: '{' without '}'`},
		{"key with a stray brace", `{"zones":[{"name":"a","rate":10,"per":1000000000,"key":["{header.X}}"]}]}`,
			`zone "a": key "{header.X}}" is not a valid placeholder expression: '}' without '{'`},
		{"blank key", `{"zones":[{"name":"a","rate":10,"per":1000000000,"key":["  "]}]}`,
			`zone "a": key expressions must not be empty`},
		{"zone name with a space", `{"zones":[{"name":"a b","rate":10,"per":1000000000}]}`,
			`zone "a b": name must be 1 to 64 letters`},
		{"zone name with a brace", `{"zones":[{"name":"a}","rate":10,"per":1000000000}]}`,
			`zone "a}": name must be 1 to 64 letters`},
		{"empty zone name", `{"zones":[{"rate":10,"per":1000000000}]}`,
			`zone "": name must be 1 to 64 letters`},
		{"duplicate zone name", `{"zones":[{"name":"a","rate":10,"per":1000000000},{"name":"a","rate":1,"per":1000000000}]}`,
			`zone "a" is defined twice`},
		{"unknown headers mode", `{"headers":"draft","zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			`unknown headers mode "draft"`},
		{"zero rate", `{"zones":[{"name":"a","rate":0,"per":1000000000}]}`,
			`zone "a": rate is required`},
		{"missing rate", `{"zones":[{"name":"a","per":1000000000}]}`,
			`zone "a": rate is required`},
		{"negative rate", `{"zones":[{"name":"a","rate":-1,"per":1000000000}]}`,
			`zone "a": rate must be a positive integer`},
		{"missing period", `{"zones":[{"name":"a","rate":10}]}`,
			`zone "a": rate period must be at least one microsecond`},
		{"negative burst", `{"zones":[{"name":"a","rate":10,"per":1000000000,"burst":-1}]}`,
			`zone "a": burst must be a positive integer`},
		{"empty key", `{"zones":[{"name":"a","rate":10,"per":1000000000,"key":[""]}]}`,
			`zone "a": key expressions must not be empty`},
		{"rate_limits and zones", `{"rate_limits":{"b":{"window":"1s","max_events":1}},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			`both "rate_limits" (caddy-ratelimit's form of the zones) and "zones" (fleetlimit's) are set`},
		{"rate_limits zone name with a space", `{"rate_limits":{"my zone":{"window":"1s","max_events":1}}}`,
			`rate_limits "my zone": a zone name must be 1 to 64 letters`},
		{"rate_limits max_events zero", `{"rate_limits":{"a":{"window":"1s","max_events":0}}}`,
			`rate_limits "a": max_events must be at least 1`},
		{"rate_limits without window", `{"rate_limits":{"a":{"max_events":5}}}`,
			`rate_limits "a": window must be a positive duration`},
		{"rate_limits null zone", `{"rate_limits":{"a":null}}`, `rate_limits "a": the zone is empty`},
		{"rate_limits key with a stray brace", `{"rate_limits":{"a":{"key":"{http.request.header.X","window":"1s","max_events":1}}}`,
			`rate_limits "a": key "{http.request.header.X" is not a valid placeholder expression: '{' without '}'`},
		{"rate_limits window below a millisecond", `{"rate_limits":{"a":{"window":1000,"max_events":1}}}`,
			`rate_limits "a": a window must be a whole number of milliseconds`},
		{"jitter between a share and a percentage", `{"jitter":1.5,"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"jitter 1.5 is neither a share (0 to 1) nor a whole percentage (2 to 100)"},
		{"jitter above 100", `{"jitter":101,"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"jitter 101 is neither a share"},
		{"unknown log_denials", `{"log_denials":"warn","zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			`unknown log_denials "warn" (want info, debug or off)`},
		{"redis without address", `{"redis":{"password":"` + secret + `"},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: address is required"},
		{"redis negative db", `{"redis":{"address":"127.0.0.1:6379","password":"` + secret + `","db":-1},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: db must not be negative"},
		{"redis negative timeout", `{"redis":{"address":"127.0.0.1:6379","password":"` + secret + `","timeout":-1},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: timeout must not be negative"},
		{"redis cluster and sentinel", `{"redis":{"cluster":true,"sentinel_master":"m","sentinel_addresses":["127.0.0.1:26379"]},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: cluster and sentinel exclude each other"},
		{"redis sentinel and address", `{"redis":{"address":"127.0.0.1:6379","password":"` + secret + `","sentinel_master":"m","sentinel_addresses":["127.0.0.1:26379"]},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: give either sentinels or server addresses, not both"},
		{"redis sentinel without sentinels", `{"redis":{"sentinel_master":"m"},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: a Sentinel master needs at least one sentinel address"},
		{"redis db with cluster nodes", `{"redis":{"addresses":["127.0.0.1:7000","127.0.0.1:7001"],"db":1},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: a Cluster has only db 0"},
		{"redis protocol 4", `{"redis":{"address":"127.0.0.1:6379","password":"` + secret + `","protocol":4},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: protocol must be 2 or 3, got 4"},
		{"redis negative deny cache", `{"redis":{"address":"127.0.0.1:6379","password":"` + secret + `","deny_cache_size":-1},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: deny_cache_size must not be negative"},
		{"redis tls cert without key", `{"redis":{"address":"127.0.0.1:6379","password":"` + secret + `","tls":{"cert":"/x.pem"}},"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"redis: tls: a client certificate needs both cert and key"},
		{"unknown on_error", `{"zones":[{"name":"a","rate":10,"per":1000000000,"on_error":"retry"}]}`,
			`zone "a": on_error must be allow, deny or local, got "retry"`},
		{"ipv6 prefix too long", `{"zones":[{"name":"a","rate":10,"per":1000000000,"ipv6_prefix":129}]}`,
			`zone "a": ipv6_prefix must be 1 to 128, got 129`},
		{"negative sweep_interval", `{"sweep_interval":-1,"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			"sweep_interval must not be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Loaded as Caddy loads it, which names the module.
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			_, err := ctx.LoadModuleByID("http.handlers.rate_limit", json.RawMessage(tc.json))
			if err == nil {
				t.Fatalf("provisioned without error: %s", tc.json)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.phrase) {
				t.Errorf("error does not say %q: %s", tc.phrase, msg)
			}
			if n := strings.Count(msg, "rate_limit: "); n != 1 {
				t.Errorf("error names the module %d times, want once (Caddy's prefix): %s", n, msg)
			}
			if strings.Contains(msg, secret) {
				t.Errorf("error shows the redis password: %s", msg)
			}
		})
	}
}

// FuzzCaddyfile feeds arbitrary text as the body of a rate_limit block. The
// adapter may refuse it but must not panic; what it accepts must be valid
// JSON, and every rate_limit handler in it must provision: a Caddyfile that
// adapts but then fails at start-up would report its mistake without a line.
func FuzzCaddyfile(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.caddytest"))
	if err != nil {
		f.Fatal(err)
	}
	var seeds []string
	for _, file := range files {
		caddyfile, _ := readGolden(f, file)
		seeds = append(seeds, caddyfile)
	}
	for _, tc := range badCaddyfiles {
		seeds = append(seeds, tc.caddyfile)
	}
	for _, s := range seeds {
		for _, body := range rateLimitBodies(s) {
			f.Add(body)
		}
		f.Add(s) // a whole Caddyfile as a body: nested sites, stray braces
	}
	for _, s := range []string{
		"zone a {\n\trate 1 1us\n\tburst 1125899906842624\n}",
		"zone a {\n\trate 9223372036854775807 1s\n\tburst 1\n}",
		"zone a {\n\trate 9007199254740992 1s\n\tburst 1\n}",
		"redis {\n\taddress a:1\n\tdb 9223372036854775807\n}\nzone a {\n\trate 10 1s\n}",
		"zone a {\n\trate 10 1s\n\tcost {header.X-Cost\n}",
		"zone a {\n\tkey `{client_ip}` \"{header.A} {header.B}\"\n\trate 10 1s\n}",
		"zone a {\n\tkey <<EOF\n\tx\n\tEOF\n\trate 10 1s\n}",
		"zone a {\n\trate 10 1s\n\tmatch {\n\t\tnot path /x\n\t}\n}",
		"zone a {\n\trate 10 1s\n}\n}\n:81 {\n\trate_limit {\n\t\tzone a {\n\t\t\trate 1 1s",
		"redis {\n\taddress {$REDIS_ADDR:127.0.0.1:6379}\n}\nzone a {\n\trate 10 1s\n}",
		"\x00{\\}\"",
	} {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, body string) {
		caddyfile := ":80 {\n\trate_limit {\n" + body + "\n\t}\n}\n"
		out, _, err := adaptCaddyfile(caddyfile)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("adapted to invalid JSON:\n%s", out)
		}
		for _, raw := range rateLimitHandlers(t, out) {
			var h struct{ Redis *struct{ Address string } }
			if json.Unmarshal(raw, &h) == nil && h.Redis != nil && strings.Contains(h.Redis.Address, "{") {
				continue // depends on the environment at start-up ({env.*})
			}
			err := provisionHandler(raw)
			if err != nil && strings.Contains(err.Error(), "loading matchers:") {
				continue // Caddy's matchers: `match { method }` adapts and then fails in Caddy too
			}
			if err != nil {
				t.Errorf("adapted, but the handler does not provision: %v\nCaddyfile:\n%s\nJSON: %s", err, caddyfile, raw)
			}
		}
	})
}

// adaptCaddyfile runs the Caddyfile adapter as `caddy adapt` does.
func adaptCaddyfile(caddyfile string) ([]byte, []caddyconfig.Warning, error) {
	return caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
}

// provisionHandler builds a handler from its JSON the way Caddy loads it
// and releases it again.
func provisionHandler(raw []byte) error {
	var h fleetlimit.Handler
	if err := json.Unmarshal(raw, &h); err != nil {
		return err
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		return err
	}
	defer h.Cleanup()
	return h.Validate()
}

// readGolden splits a golden file into its Caddyfile (ending in a newline,
// as `caddy fmt` leaves it) and its expected JSON.
func readGolden(t testing.TB, file string) (caddyfile, expected string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	before, after, ok := strings.Cut(text, goldenSeparator)
	if !ok {
		t.Fatalf("%s: no line of exactly %q", file, strings.TrimSpace(goldenSeparator))
	}
	return strings.TrimSpace(before) + "\n", strings.TrimSpace(after)
}

// writeGolden replaces a golden file's JSON with what the adapter makes of
// its Caddyfile now, and returns that JSON.
func writeGolden(t *testing.T, file, caddyfile string) string {
	t.Helper()
	out, _, err := adaptCaddyfile(caddyfile)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var buf strings.Builder
	var indented []byte
	if indented, err = indentJSON(out); err != nil {
		t.Fatal(err)
	}
	buf.WriteString(caddyfile)
	buf.WriteString(strings.TrimPrefix(goldenSeparator, "\n"))
	buf.Write(indented)
	buf.WriteString("\n")
	if err := os.WriteFile(file, []byte(buf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return string(indented)
}

// indentJSON indents as caddytest.CompareAdapt and `caddy adapt --pretty` do.
func indentJSON(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	err := json.Indent(&buf, b, "", "\t")
	return buf.Bytes(), err
}

// rateLimitHandlers returns the JSON of every rate_limit handler in an
// adapted config, in any route or subroute.
func rateLimitHandlers(t testing.TB, config []byte) []json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.UseNumber() // re-encode numbers exactly as the adapter wrote them
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("adapted config is not JSON: %v", err)
	}
	var found []json.RawMessage
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "rate_limit" {
				b, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				found = append(found, b)
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return found
}

// rateLimitBodies returns the text inside each `rate_limit … { … }` block of
// a Caddyfile, found by counting braces (good enough for seeds).
func rateLimitBodies(caddyfile string) []string {
	var bodies []string
	rest := caddyfile
	for {
		i := strings.Index(rest, "rate_limit")
		if i < 0 {
			return bodies
		}
		rest = rest[i+len("rate_limit"):]
		line, _, _ := strings.Cut(rest, "\n")
		open := strings.Index(line, "{")
		if open < 0 {
			continue
		}
		depth := 0
		for j := open; j < len(rest); j++ {
			switch rest[j] {
			case '{':
				depth++
			case '}':
				depth--
			}
			if depth == 0 {
				bodies = append(bodies, strings.Trim(rest[open+1:j], "\n"))
				rest = rest[j:]
				break
			}
		}
		if depth != 0 {
			return bodies
		}
	}
}

// TestCaddyfileWantLists checks the lists that unknown subdirectives get,
// built from the parsers' tables: every name listed is one the parser
// knows, and the list has them all.
func TestCaddyfileWantLists(t *testing.T) {
	wantRE := regexp.MustCompile(`\(want ([a-z0-9_, ]+)\)`)
	blocks := []struct {
		name   string
		wrap   func(sub string) string
		length int // how many names the list must have
	}{
		{"rate_limit", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\t" + sub + "\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t}\n\t}\n}\n"
		}, 14},
		{"zone", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t\t" + sub + "\n\t\t}\n\t}\n}\n"
		}, 25},
		{"redis", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\tredis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\t" + sub + "\n\t\t}\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t}\n\t}\n}\n"
		}, 21},
		{"redis tls", func(sub string) string {
			return ":80 {\n\trate_limit {\n\t\tredis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\ttls {\n\t\t\t\t" + sub + "\n\t\t\t}\n\t\t}\n\t\tzone api {\n\t\t\trate 10 1s\n\t\t}\n\t}\n}\n"
		}, 5},
	}
	for _, b := range blocks {
		t.Run(b.name, func(t *testing.T) {
			_, _, err := adaptCaddyfile(b.wrap("no_such_thing 1"))
			if err == nil {
				t.Fatal("an unknown subdirective adapted")
			}
			m := wantRE.FindStringSubmatch(err.Error())
			if m == nil {
				t.Fatalf("no list of subdirectives in: %v", err)
			}
			names := strings.Split(strings.Replace(m[1], " or ", ", ", 1), ", ")
			if len(names) != b.length {
				t.Errorf("the list has %d names, want %d: %s", len(names), b.length, m[1])
			}
			for _, name := range names {
				_, _, err := adaptCaddyfile(b.wrap(name + " 1"))
				if err != nil && strings.Contains(err.Error(), "unknown") && strings.Contains(err.Error(), `"`+name+`"`) {
					t.Errorf("%s is listed but unknown: %v", name, err)
				}
			}
		})
	}
}
