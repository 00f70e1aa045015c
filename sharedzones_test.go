package fleetlimit

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestLookupZone: the zone of the handler provisioned last is found (a
// reload's new configuration while the old one runs), the previous one
// again once the new one is cleaned up (a load that failed), none once
// both are; a zone whose rate comes from placeholders is refused.
func TestLookupZone(t *testing.T) {
	provision := func(rate int64, placeholder string) *Handler {
		z := &Zone{Name: "lookup_test", Rate: rate, RatePlaceholder: placeholder, Per: caddy.Duration(time.Minute)}
		h := &Handler{Zones: []*Zone{z}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return h
	}
	rateOf := func() int64 {
		z, err := LookupZone("lookup_test")
		if err != nil {
			t.Fatal(err)
		}
		return z.Rule.Rate()
	}
	old := provision(10, "")
	if got := rateOf(); got != 10 {
		t.Fatalf("rate %d, want 10", got)
	}
	next := provision(20, "")
	if got := rateOf(); got != 20 {
		t.Fatalf("with a new configuration: rate %d, want its 20", got)
	}
	_ = next.Cleanup()
	if got := rateOf(); got != 10 {
		t.Fatalf("after the new configuration's cleanup: rate %d, want the running 10", got)
	}
	_ = old.Cleanup()
	if _, err := LookupZone("lookup_test"); err == nil {
		t.Fatal("a zone of no running handler was found")
	}
	tiers := provision(0, "{plan_rate}")
	defer tiers.Cleanup()
	if _, err := LookupZone("lookup_test"); err == nil {
		t.Fatal("a zone with a placeholder rate was shared")
	}
}
