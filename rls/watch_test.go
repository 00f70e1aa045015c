package rls

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestRulesFollowFiles: a changed file's rules take over without a reload;
// a file that does not load leaves the previous rules in place, and its
// fix is taken.
func TestRulesFollowFiles(t *testing.T) {
	rule := func(n int) string {
		return "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: " + string(rune('0'+n)) + "}\n"
	}
	a := startApp(t, map[string]string{"api.yaml": rule(3)}, func(a *App) {
		a.ConfigRefreshInterval = caddy.Duration(20 * time.Millisecond)
	})
	e := patientEnvoy(t, a.addr(0))
	limit := func() uint32 {
		return e.must("api", hits(desc("user", "u"), 0)).Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	write := func(content string) {
		// A new modification time, even within the file system's clock tick.
		path := filepath.Join(a.ConfigDir, "api.yaml")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Duration(len(content)) * time.Second)
		_ = os.Chtimes(path, later, later)
	}
	waitFor := func(want uint32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for limit() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the rule is still %d per hour 10s after its file changed, want %d", limit(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := limit(); got != 3 {
		t.Fatalf("limit %d, want 3", got)
	}
	write(rule(5))
	waitFor(5)
	write("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	time.Sleep(200 * time.Millisecond) // ten looks at the files
	if got := limit(); got != 5 {
		t.Fatalf("after a broken file the rule is %d per hour, want the previous 5", got)
	}
	write(rule(7))
	waitFor(7)
}
