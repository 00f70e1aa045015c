package fleetlimit_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// badJSON are JSON configs that provisioning refuses, each with a phrase
// of the message that says what is wrong.
var badJSON = []struct {
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
	{"exempt not an address", `{"exempt":["10.0.0.0/8","nope"],"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
		`exempt: "nope" is not an IP address or CIDR network`},
	{"zone exempt prefix too long", `{"zones":[{"name":"a","rate":10,"per":1000000000,"exempt":["192.0.2.1/40"]}]}`,
		`zone "a": exempt: "192.0.2.1/40" is not an IP address or CIDR network`},
	{"soft_shed of 100", `{"zones":[{"name":"a","rate":10,"per":1000000000,"soft_shed":100}]}`,
		"soft_shed must be a whole percentage from 1 to 99, got 100"},
	{"negative soft_shed", `{"zones":[{"name":"a","rate":10,"per":1000000000,"soft_shed":-5}]}`,
		"soft_shed must be a whole percentage from 1 to 99, got -5"},
	{"soft_shed_max_delay alone", `{"zones":[{"name":"a","rate":10,"per":1000000000,"soft_shed_max_delay":"1s"}]}`,
		"soft_shed_max_delay needs soft_shed <percent>"},
	{"soft_shed_max_delay over an hour", `{"zones":[{"name":"a","rate":10,"per":1000000000,"soft_shed":50,"soft_shed_max_delay":"2h"}]}`,
		"soft_shed's max delay must be positive and at most 1h0m0s, got 2h0m0s"},
	{"soft_shed on a fixed window", `{"zones":[{"name":"a","algorithm":"fixed_window","rate":10,"per":1000000000,"soft_shed":50}]}`,
		"soft_shed applies to token_bucket only"},
}

// TestBadJSONProvision checks that the JSON config, which a user may write
// without the Caddyfile's checks, is refused at provisioning with a message
// that says what is wrong.
func TestBadJSONProvision(t *testing.T) {
	for _, tc := range badJSON {
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
