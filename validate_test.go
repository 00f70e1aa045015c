package fleetlimit

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestValidateRefusesWhatProvisionRefuses: Validate alone refuses every
// configuration that Provision refuses (matchers aside), with the same
// error.
func TestValidateRefusesWhatProvisionRefuses(t *testing.T) {
	t.Parallel()
	const zone = `{"name":"a","rate":1,"per":1000000000}`
	missing := filepath.Join(t.TempDir(), "missing.pem")
	ca, _ := json.Marshal(missing)
	for name, raw := range map[string]string{
		"no zone":            `{}`,
		"headers":            `{"headers":"loud","zones":[` + zone + `]}`,
		"log_denials":        `{"log_denials":"warn","zones":[` + zone + `]}`,
		"max_keys":           `{"max_keys":-1,"zones":[` + zone + `]}`,
		"jitter":             `{"jitter":1.5,"zones":[` + zone + `]}`,
		"zone defined twice": `{"zones":[` + zone + `,` + zone + `]}`,
		"algorithm":          `{"zones":[{"name":"a","algorithm":"nope","rate":1,"per":1000000000}]}`,
		"cost over burst":    `{"zones":[{"name":"a","rate":2,"per":1000000000,"cost":"3"}]}`,
		"cost_header_abort":  `{"zones":[{"name":"a","rate":2,"per":1000000000,"cost_header":"X-Tokens-Used","cost_header_abort":-1}]}`,
		"abort alone":        `{"zones":[{"name":"a","rate":2,"per":1000000000,"cost_header_abort":5}]}`,
		"both forms":         `{"zones":[` + zone + `],"rate_limits":{"b":{"window":1000000000,"max_events":1}}}`,
		"rate_limits":        `{"rate_limits":{"b":{"window":1000000000}}}`,
		"redis address":      `{"redis":{},"zones":[` + zone + `]}`,
		"redis tls files":    `{"redis":{"address":"127.0.0.1:1","tls":{"ca":` + string(ca) + `}},"zones":[` + zone + `]}`,
		"key_digest_secret":  `{"key_digest_secret":"{env.FLEETLIMIT_TEST_UNSET_SECRET}","zones":[` + zone + `]}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var alone, provisioned Handler
			for _, h := range []*Handler{&alone, &provisioned} {
				if err := json.Unmarshal([]byte(raw), h); err != nil {
					t.Fatal(err)
				}
			}
			verr := alone.Validate()
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			perr := provisioned.Provision(ctx)
			_ = provisioned.Cleanup()
			if perr == nil {
				t.Fatalf("Provision accepted %s", raw)
			}
			if verr == nil {
				t.Fatalf("Validate accepted what Provision refuses (%v): %s", perr, raw)
			}
			if verr.Error() != perr.Error() {
				t.Fatalf("Validate: %v\nProvision: %v", verr, perr)
			}
		})
	}
}

// TestValidateAfterProvision: Validate accepts a configuration that
// provisioned, as Caddy calls it after Provision, caddy-ratelimit's
// rate_limits form included (provisioning turns it into zones).
func TestValidateAfterProvision(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`{"zones":[{"name":"a","rate":1,"per":1000000000}]}`,
		`{"rate_limits":{"b":{"window":1000000000,"max_events":1},"c":{"window":1000000000,"max_events":2}}}`,
	} {
		h, _ := testHandler(t, raw)
		if len(h.Zones) == 0 {
			t.Fatalf("no zones provisioned from %s", raw)
		}
		if err := h.Validate(); err != nil {
			t.Errorf("Validate after Provision: %v\n%s", err, raw)
		}
	}
}
