package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The alerting rules and the Grafana dashboard that ship in deploy/.
var (
	rulesFile     = filepath.Join("deploy", "prometheus", "fleetlimit.rules.yml")
	rulesTestFile = filepath.Join("deploy", "prometheus", "fleetlimit.rules_test.yml")
	dashboardFile = filepath.Join("deploy", "grafana", "fleetlimit.json")
)

// promtoolPath returns promtool's path (Debian's prometheus package ships
// it). Like redis-server, it is required in CI (CI set): there a missing
// binary fails the test; elsewhere the test is skipped with a note.
func promtoolPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("promtool is required by this test and is not on PATH (install it: apt-get install prometheus): %v", err)
		}
		t.Skipf("promtool is not on PATH (apt-get install prometheus); CI is not set, so this test is skipped: %v", err)
	}
	return p
}

// runPromtool runs promtool with args in dir and fails the test on error.
func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtoolPath(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules checks the alerting rules with promtool and runs their
// unit tests, and checks that every alert has one.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	root := localfleet.RepoRoot()
	runPromtool(t, root, "check", "rules", rulesFile)
	out := runPromtool(t, root, "test", "rules", rulesTestFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules did not report SUCCESS:\n%s", out)
	}
	rules := readRepoFile(t, rulesFile)
	tests := readRepoFile(t, rulesTestFile)
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(rules, -1)
	if len(alerts) < 9 {
		t.Fatalf("%s has %d alerts, want at least the 9 of the issue", rulesFile, len(alerts))
	}
	for _, a := range alerts {
		// A test that expects the alert to fire: its name, then labels.
		fires := regexp.MustCompile(`alertname: ` + regexp.QuoteMeta(a[1]) + `\n\s+exp_alerts:\n\s+- exp_labels:`)
		if !fires.MatchString(tests) {
			t.Errorf("alert %s has no promtool test in which it fires", a[1])
		}
	}
}

// TestDashboardQueries checks that every query of the Grafana dashboard is
// valid PromQL, by giving them to promtool as recording rules, with
// Grafana's variables set as Grafana would.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	exprs := dashboardExprs(t)
	if len(exprs) < 10 {
		t.Fatalf("the dashboard has %d queries", len(exprs))
	}
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	grafana := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*", "$zone", ".*")
	for i, e := range exprs {
		q, _ := json.Marshal(grafana.Replace(e)) // a JSON string is a YAML string
		fmt.Fprintf(&b, "      - record: dashboard_query_%d\n        expr: %s\n", i, q)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "check", "rules", "dashboard.rules.yml")
}

// TestDashboardAndAlertMetricsExist starts two real nodes, one on the
// memory store and one on Redis with local fallback buckets, sends them
// traffic (admitted, denied, exempt), scrapes their /metrics, and checks
// that every metric the dashboard and the alerting rules query is there.
func TestDashboardAndAlertMetricsExist(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	zones := `
		exempt 127.0.0.2
		zone api {
			key {header.X-Key}
			rate 3 1h
		}`
	mem := startCaddy(t, "", `
	rate_limit {`+zones+`
	}
	respond "ok"`)
	red := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
		}`+zones+`
	}
	respond "ok"`, r.Addr))
	have := map[string]bool{}
	for _, n := range []*node{mem, red} {
		if got := n.statuses(5, "/", "X-Key: m"); got[200] != 3 || got[429] != 2 {
			t.Fatalf("traffic: %v", got)
		}
		newSourceClient(t, "127.0.0.2").statuses(n, 2, "/", "X-Key: m")
	}
	// The Redis node reads its clock offset once a second and Redis'
	// memory at start: wait until both show.
	waitMetric(t, red, "caddy_rate_limit_clock_offset_seconds")
	waitMetric(t, red, "caddy_rate_limit_redis_memory_warning")
	for _, n := range []*node{mem, red} {
		for _, s := range n.scrape() {
			have[s.Name] = true
		}
	}

	var queried []string
	for _, e := range dashboardExprs(t) {
		queried = append(queried, metricNames(e)...)
	}
	var ruleText []string
	for _, line := range strings.Split(readRepoFile(t, rulesFile), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			ruleText = append(ruleText, line)
		}
	}
	queried = append(queried, metricNames(strings.Join(ruleText, "\n"))...)
	slices.Sort(queried)
	queried = slices.Compact(queried)
	if len(queried) < 10 {
		t.Fatalf("the dashboard and rules query %d metrics: %v", len(queried), queried)
	}
	for _, name := range queried {
		if !have[name] {
			t.Errorf("%s is queried by the dashboard or the alerting rules, and no node's /metrics has it", name)
		}
	}
}

// waitMetric waits, a bounded time, until the node's /metrics has name.
func waitMetric(t *testing.T, n *node, name string) {
	t.Helper()
	for range 100 {
		if _, ok := metric(n.scrape(), name); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never appeared in /metrics", name)
}

// metricNames returns the fleetlimit metric names in a text.
func metricNames(text string) []string {
	return regexp.MustCompile(`\bcaddy_rate_limit_[a-z_]+\b`).FindAllString(text, -1)
}

// readRepoFile reads a file of the repository.
func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(localfleet.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dashboardExprs returns the PromQL of the dashboard: every panel's
// targets and every query variable's query.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	var dash any
	if err := json.Unmarshal([]byte(readRepoFile(t, dashboardFile)), &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(x, k)
			}
		case []any:
			for _, x := range v {
				walk(x, key)
			}
		case string:
			if key == "expr" {
				out = append(out, v)
			}
			if key == "query" && strings.HasPrefix(v, "label_values(") {
				// label_values(<selector>, label): the selector is PromQL.
				inner := strings.TrimSuffix(strings.TrimPrefix(v, "label_values("), ")")
				if i := strings.LastIndexByte(inner, ','); i > 0 {
					out = append(out, strings.TrimSpace(inner[:i]))
				}
			}
		}
	}
	walk(dash, "")
	slices.Sort(out)
	return out
}
