package rls

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// provisionHandler provisions a rate_limit handler with zones, as Caddy's
// http app would, and cleans it up when the test ends.
func provisionHandler(t *testing.T, redis *fleetlimit.RedisConfig, zones ...*fleetlimit.Zone) {
	t.Helper()
	h := &fleetlimit.Handler{Redis: redis, Zones: zones}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
}

// TestZoneRules: a rule with a zone spends the zone's bucket on the memory
// store shared with the handler, reports the zone's rate, and is refused
// at load when the zone is missing, cannot be shared, or lives in another
// store.
func TestZoneRules(t *testing.T) {
	provisionHandler(t, nil,
		&fleetlimit.Zone{Name: "rls_zone_test", Rate: 10, Per: caddy.Duration(30 * time.Second)},
		&fleetlimit.Zone{Name: "rls_zone_leaky", Algorithm: "leaky_bucket", Rate: 10, Per: caddy.Duration(time.Second)})
	rule := func(zone string, extra string) map[string]string {
		return map[string]string{"z.yaml": "domain: z\ndescriptors:\n  - key: remote_address\n" + extra +
			"    rate_limit: {zone: " + zone + "}\n"}
	}
	a := startApp(t, rule("rls_zone_test", ""), nil)
	e := patientEnvoy(t, a.addr(0))
	resp := e.must("z", desc("remote_address", "192.0.2.1"))
	cur := resp.Statuses[0].CurrentLimit
	if answerCodes(resp) != "OK: OK" || resp.Statuses[0].LimitRemaining != 9 || cur.GetRequestsPerUnit() != 10 ||
		cur.GetUnit().String() != "SECOND" || cur.GetUnitMultiplier().GetValue() != 30 {
		t.Fatalf("zone rule: %v, want OK, 9 left, 10 per 30 SECOND", resp)
	}

	srv := redistest.Start(t)
	for _, c := range []struct {
		files  map[string]string
		redis  *fleetlimit.RedisConfig
		reason string
	}{
		{rule("rls_zone_missing", ""), nil, `no rate_limit zone "rls_zone_missing"`},
		{rule("rls_zone_leaky", ""), nil, "delays requests"},
		{rule("rls_zone_test", "    shadow_mode: true\n"), nil, "shadow_mode and quota_mode do not apply"},
		{rule("rls_zone_test", ""), &fleetlimit.RedisConfig{Address: srv.Addr}, "another store"},
	} {
		dir := t.TempDir()
		for name, content := range c.files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		app := &App{ConfigDir: dir, Redis: c.redis}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := app.Provision(ctx)
		_ = app.Cleanup()
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), "z.yaml:") {
			t.Errorf("%v: %v, want an error naming z.yaml's line and %q", c.files, err, c.reason)
		}
	}
}
