package fleetlimit_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestExemptBadCaddyfile checks that a bad exempt entry, on the handler or
// in a zone, is reported at its own line, naming the entry.
func TestExemptBadCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name, caddyfile string
		line            int
		phrase          string
	}{
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkBadCaddyfile(t, tc.caddyfile, tc.line, tc.phrase)
		})
	}
}

// TestExemptBadJSON checks that a JSON config's bad exempt entries are
// refused at provisioning, naming the entry (and the zone).
func TestExemptBadJSON(t *testing.T) {
	for _, tc := range []struct{ json, phrase string }{
		{`{"exempt":["10.0.0.0/8","nope"],"zones":[{"name":"a","rate":10,"per":1000000000}]}`,
			`exempt: "nope" is not an IP address or CIDR network`},
		{`{"zones":[{"name":"a","rate":10,"per":1000000000,"exempt":["192.0.2.1/40"]}]}`,
			`zone "a": exempt: "192.0.2.1/40" is not an IP address or CIDR network`},
	} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		_, err := ctx.LoadModuleByID("http.handlers.rate_limit", json.RawMessage(tc.json))
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.phrase) {
			t.Errorf("%s: error %v, want one saying %q", tc.json, err, tc.phrase)
		}
	}
}
