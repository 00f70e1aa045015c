package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The README's tour is run here as the README writes it: its blocks are
// read from README.md (each follows a "<!-- tour: NAME -->" line), the
// configurations are the repository's Caddyfile.example and the README's
// Caddyfile.fleet, and what the README shows (headers, status sequences,
// the 429, the log line) is checked against what the processes answer.
// A failure names the README's line.

// tourBlock is a fenced block of the README that follows a tour marker.
type tourBlock struct {
	name  string
	line  int // the README line of the block's first line of content
	lines []string
}

// at names the README line of the block's i-th line.
func (b tourBlock) at(i int) string { return fmt.Sprintf("README.md:%d", b.line+i) }

func (b tourBlock) text() string { return strings.Join(b.lines, "\n") + "\n" }

// readTour returns the README's tour blocks by name.
func readTour(t *testing.T) map[string]tourBlock {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(localfleet.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	marker := regexp.MustCompile(`^<!-- tour: (\S+) -->$`)
	blocks := map[string]tourBlock{}
	for i := 0; i < len(lines); i++ {
		m := marker.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j == len(lines) || !strings.HasPrefix(lines[j], "```") {
			t.Fatalf("README.md:%d: the tour marker %q is not followed by a fenced block", i+1, m[1])
		}
		b := tourBlock{name: m[1], line: j + 2}
		for j++; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			b.lines = append(b.lines, lines[j])
		}
		if j == len(lines) {
			t.Fatalf("README.md:%d: the block of %q is not closed", b.line-1, m[1])
		}
		blocks[m[1]] = b
		i = j
	}
	return blocks
}

func need(t *testing.T, blocks map[string]tourBlock, name string) tourBlock {
	t.Helper()
	b, ok := blocks[name]
	if !ok {
		t.Fatalf("README.md has no block after <!-- tour: %s -->", name)
	}
	return b
}

// tourRule is the rate and burst of a zone in a README block.
type tourRule struct {
	rate  int
	per   time.Duration
	burst int
}

// refill is how many tokens the rule adds over d, rounded down.
func (r tourRule) refill(d time.Duration) int { return int(int64(r.rate) * int64(d) / int64(r.per)) }

// ruleOf reads the rate and burst of the first zone in a Caddyfile block.
func ruleOf(t *testing.T, b tourBlock) tourRule {
	t.Helper()
	var r tourRule
	rate := regexp.MustCompile(`^rate\s+(\d+)\s+(\S+)`)
	burst := regexp.MustCompile(`^burst\s+(\d+)`)
	for i, l := range b.lines {
		l = strings.TrimSpace(l)
		if m := rate.FindStringSubmatch(l); m != nil && r.rate == 0 {
			r.rate, _ = strconv.Atoi(m[1])
			d, err := time.ParseDuration(m[2])
			if err != nil {
				t.Fatalf("%s: rate %q: %v", b.at(i), m[2], err)
			}
			r.per = d
		}
		if m := burst.FindStringSubmatch(l); m != nil && r.burst == 0 {
			r.burst, _ = strconv.Atoi(m[1])
		}
	}
	if r.rate == 0 || r.burst == 0 {
		t.Fatalf("README.md:%d: no zone with rate and burst in the %s block", b.line, b.name)
	}
	return r
}

// statusesOf reads a line of status codes.
func statusesOf(t *testing.T, b tourBlock, i int) []int {
	t.Helper()
	var out []int
	for _, f := range strings.Fields(b.lines[i]) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 100 || n > 599 {
			t.Fatalf("%s: %q is not a status code", b.at(i), f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no status codes", b.at(i))
	}
	return out
}

// shownResponse is an HTTP response as the README shows it (curl -i).
type shownResponse struct {
	status     int
	statusLine int // index into the block's lines
	headers    []shownHeader
	body       string
	bodyLine   int
}

type shownHeader struct {
	name, value string
	line        int
}

// responseOf reads the response that starts at the block's i-th line.
func responseOf(t *testing.T, b tourBlock, i int) shownResponse {
	t.Helper()
	f := strings.Fields(b.lines[i])
	if len(f) < 3 || !strings.HasPrefix(f[0], "HTTP/") {
		t.Fatalf("%s: %q is not a status line", b.at(i), b.lines[i])
	}
	code, err := strconv.Atoi(f[1])
	if err != nil || strings.Join(f[2:], " ") != http.StatusText(code) {
		t.Fatalf("%s: %q is not a status line", b.at(i), b.lines[i])
	}
	r := shownResponse{status: code, statusLine: i}
	for i++; i < len(b.lines) && strings.TrimSpace(b.lines[i]) != ""; i++ {
		name, value, ok := strings.Cut(b.lines[i], ":")
		if !ok {
			t.Fatalf("%s: %q is not a header line", b.at(i), b.lines[i])
		}
		r.headers = append(r.headers, shownHeader{http.CanonicalHeaderKey(name), strings.TrimSpace(value), i})
	}
	if i+1 < len(b.lines) {
		r.body, r.bodyLine = strings.TrimSpace(strings.Join(b.lines[i+1:], "\n")), i+1
	}
	return r
}

// limitHeaders are the headers the README shows of a rate-limited
// response; a response must carry exactly those of them that are shown.
var limitHeaders = []string{"Ratelimit", "Ratelimit-Policy", "Retry-After", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"}

// checkResponse checks a live response against the README's. Values are
// equal, but for seconds to come (Retry-After, X-Ratelimit-Reset and t= of
// RateLimit): those may differ by a second, as the time the request came.
func checkResponse(t *testing.T, b tourBlock, want shownResponse, got localfleet.Response) {
	t.Helper()
	if got.Status != want.status {
		t.Errorf("%s: status %d, the README shows %d", b.at(want.statusLine), got.Status, want.status)
	}
	shown := map[string]bool{}
	for _, h := range want.headers {
		shown[h.name] = true
		v := got.Header.Get(h.name)
		if !sameValue(h.name, h.value, v) {
			t.Errorf("%s: %s is %q, the README shows %q", b.at(h.line), h.name, v, h.value)
		}
	}
	for _, name := range limitHeaders {
		if got.Header.Get(name) != "" && !shown[name] {
			t.Errorf("README.md:%d: the response also has %s: %q, which the README does not show", b.line+want.statusLine, name, got.Header.Get(name))
		}
	}
	if want.body == "" {
		return
	}
	var wantJSON, gotJSON any
	if json.Unmarshal([]byte(want.body), &wantJSON) == nil {
		if err := json.Unmarshal([]byte(got.Body), &gotJSON); err != nil || !reflect.DeepEqual(wantJSON, gotJSON) {
			t.Errorf("%s: body %s, the README shows %s", b.at(want.bodyLine), got.Body, want.body)
		}
	} else if strings.TrimSpace(got.Body) != want.body {
		t.Errorf("%s: body %q, the README shows %q", b.at(want.bodyLine), got.Body, want.body)
	}
}

// sameValue compares a header's value with the README's (see checkResponse).
func sameValue(name, want, got string) bool {
	switch name {
	case "Retry-After", "X-Ratelimit-Reset":
		return nearSeconds(want, got)
	case "Ratelimit":
		wi, gi := strings.LastIndex(want, ";t="), strings.LastIndex(got, ";t=")
		return wi >= 0 && gi >= 0 && want[:wi] == got[:gi] && nearSeconds(want[wi+3:], got[gi+3:])
	}
	return want == got
}

func nearSeconds(want, got string) bool {
	w, err1 := strconv.Atoi(want)
	g, err2 := strconv.Atoi(got)
	return err1 == nil && err2 == nil && g >= 1 && g >= w-1 && g <= w+1
}

// tourRun is a run of requests and what they got.
type tourRun struct {
	statuses []int
	node     []int // which node answered each (0 with one node)
	elapsed  time.Duration
}

// leading is how many requests passed before the first denial.
func leading(statuses []int) int {
	for i, s := range statuses {
		if s != http.StatusOK {
			return i
		}
	}
	return len(statuses)
}

func count(statuses []int, status int) int {
	n := 0
	for _, s := range statuses {
		if s == status {
			n++
		}
	}
	return n
}

// runUntilDenied sends at least n GET requests to path, alternating
// between the nodes as the README's loop does (request i to node i % len),
// and goes on until every node has denied one, up to n+200 requests.
func runUntilDenied(t *testing.T, nodes []*localfleet.Node, n int, path string, headers ...string) tourRun {
	t.Helper()
	var run tourRun
	denied := make([]bool, len(nodes))
	start := time.Now()
	for i := 1; i <= n+200; i++ {
		k := i % len(nodes)
		r, err := nodes[k].Do(http.MethodGet, path, headers...)
		if err != nil {
			t.Fatalf("GET %s: %v\ncaddy output:\n%s", path, err, nodes[k].Log.String())
		}
		run.statuses, run.node = append(run.statuses, r.Status), append(run.node, k)
		denied[k] = denied[k] || r.Status == http.StatusTooManyRequests
		if i >= n && !slices.Contains(denied, false) {
			break
		}
	}
	run.elapsed = time.Since(start)
	return run
}

// checkOneLimit checks a run over several nodes that share one bucket:
// each node denied before it admitted the burst itself, which separate
// buckets per node could not do.
func checkOneLimit(t *testing.T, where string, statuses, node []int, nodes int, rule tourRule) {
	t.Helper()
	admitted := make([]int, nodes)
	deniedAt := make([]int, nodes)
	for k := range deniedAt {
		deniedAt[k] = -1
	}
	for i, s := range statuses {
		k := node[i]
		switch {
		case s == http.StatusOK:
			admitted[k]++
		case s == http.StatusTooManyRequests && deniedAt[k] < 0:
			deniedAt[k] = admitted[k]
		}
	}
	for k, at := range deniedAt {
		if at < 0 || at >= rule.burst {
			t.Errorf("%s: node %d admitted %d before its first 429 (-1: none); with one bucket for the fleet it denies before it admits the burst (%d) itself", where, k, at, rule.burst)
		}
	}
}

// TestReadmeTour runs the README's tour.
func TestReadmeTour(t *testing.T) {
	t.Parallel()
	blocks := readTour(t)
	t.Run("Example", func(t *testing.T) { tourExample(t, blocks) })
	t.Run("Fleet", func(t *testing.T) { tourFleet(t, blocks) })
}

// tourExample: Caddyfile.example is formatted and valid, holds the zone
// the README shows, and answers as the README shows.
func tourExample(t *testing.T, blocks map[string]tourBlock) {
	example := filepath.Join(localfleet.RepoRoot(), "Caddyfile.example")
	if out, err := exec.Command(caddyBin, "fmt", "--diff", example).CombinedOutput(); err != nil {
		t.Errorf("caddy fmt --diff Caddyfile.example: %v\n%s", err, out)
	}
	validate := exec.Command(caddyBin, "validate", "--config", example)
	validate.Env = append(os.Environ(), "HOME="+t.TempDir())
	if out, err := validate.CombinedOutput(); err != nil {
		t.Errorf("caddy validate --config Caddyfile.example: %v\n%s", err, out)
	}

	zone := need(t, blocks, "example-zone")
	checkExcerpt(t, zone, example)
	rule := ruleOf(t, zone)
	start := func() *localfleet.Node {
		port, admin := redistest.FreePort(t), redistest.FreePort(t)
		return localfleet.StartFile(t, caddyBin, example, fmt.Sprintf("localhost:%d", admin), port,
			fmt.Sprintf("PORT=%d", port), fmt.Sprintf("ADMIN=%d", admin))
	}

	// curl -i: the first response of a fresh bucket.
	first := need(t, blocks, "first-response")
	n := start()
	r, err := n.Do(http.MethodGet, "/api/hello")
	if err != nil {
		t.Fatalf("GET /api/hello: %v\n%s", err, n.Log.String())
	}
	checkResponse(t, first, responseOf(t, first, 0), r)
	n.Stop()

	// The loop spends the burst, and the next request is denied. The README
	// shows it after the first curl, by when the bucket is full again; a
	// fresh node has it full.
	burst := need(t, blocks, "burst-output")
	shown := statusesOf(t, burst, 0)
	checkStatuses(t, burst.at(0), shown, rule, 0)
	n = start()
	run := runUntilDenied(t, []*localfleet.Node{n}, len(shown), "/api/hello")
	checkStatuses(t, fmt.Sprintf("the loop of %s (live: %v in %s)", burst.at(0), run.statuses, run.elapsed), run.statuses, rule, run.elapsed)
	last, err := n.Do(http.MethodGet, "/api/hello")
	for err == nil && last.Status == http.StatusOK { // a token came back meanwhile
		last, err = n.Do(http.MethodGet, "/api/hello")
	}
	if err != nil {
		t.Fatal(err)
	}
	checkResponse(t, burst, responseOf(t, burst, 1), last)

	// An API key is a bucket of its own.
	if r, err := n.Do(http.MethodGet, "/api/hello", "X-API-Key: k1"); err != nil || r.Status != http.StatusOK {
		t.Errorf("README.md:%d: with X-API-Key: k1 after the IP's denial: %d %v, want 200 from a bucket of its own", burst.line+len(burst.lines), r.Status, err)
	}
}

// checkExcerpt checks that the README's excerpt of a file is in it: its
// lines (comments dropped) are lines of the file, in order.
func checkExcerpt(t *testing.T, b tourBlock, file string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	comment := regexp.MustCompile(`\s+#.*$`)
	var have []string
	for _, l := range strings.Split(string(raw), "\n") {
		have = append(have, strings.TrimSpace(comment.ReplaceAllString(l, "")))
	}
	j := 0
	for i, l := range b.lines {
		l = strings.TrimSpace(comment.ReplaceAllString(l, ""))
		if l == "" {
			continue
		}
		for j < len(have) && have[j] != l {
			j++
		}
		if j == len(have) {
			t.Errorf("%s: %q is not in %s (in this order)", b.at(i), l, filepath.Base(file))
			return
		}
		j++
	}
}

// checkStatuses checks a run of statuses from one fresh bucket: the burst
// passes, then a request is denied, and no more passed before it than the
// burst and what the rule refilled over elapsed (unknown for the README's
// own: a second's worth is allowed).
func checkStatuses(t *testing.T, where string, statuses []int, rule tourRule, elapsed time.Duration) {
	t.Helper()
	if elapsed == 0 {
		elapsed = time.Second
	}
	k := leading(statuses)
	if k == len(statuses) {
		t.Errorf("%s: no request was denied", where)
	}
	if k < rule.burst || k > rule.burst+rule.refill(elapsed)+1 {
		t.Errorf("%s: %d requests passed before the first denial; the burst is %d and %d tokens came back", where, k, rule.burst, rule.refill(elapsed))
	}
	if bad := len(statuses) - count(statuses, http.StatusOK) - count(statuses, http.StatusTooManyRequests); bad > 0 {
		t.Errorf("%s: %d statuses are neither 200 nor 429: %v", where, bad, statuses)
	}
}

// tourFleet: two nodes on Caddyfile.fleet share one limit through Redis,
// and keep limiting, on their own buckets, when Redis stops.
func tourFleet(t *testing.T, blocks map[string]tourBlock) {
	cfgBlock := need(t, blocks, "Caddyfile.fleet")
	rule := ruleOf(t, cfgBlock)
	cfg := filepath.Join(t.TempDir(), "Caddyfile.fleet")
	if err := os.WriteFile(cfg, []byte(cfgBlock.text()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(caddyBin, "fmt", "--diff", cfg).CombinedOutput(); err != nil {
		t.Errorf("README.md:%d: Caddyfile.fleet is not formatted: %v\n%s", cfgBlock.line, err, out)
	}
	redis := redistest.Start(t)
	var nodes []*localfleet.Node
	for range 2 {
		port, admin := redistest.FreePort(t), redistest.FreePort(t)
		nodes = append(nodes, localfleet.StartFile(t, caddyBin, cfg, fmt.Sprintf("localhost:%d", admin), port,
			fmt.Sprintf("PORT=%d", port), fmt.Sprintf("ADMIN=%d", admin), "REDIS="+redis.Addr))
	}

	// Thirty requests alternating between the nodes: one limit.
	out := need(t, blocks, "fleet-output")
	shown := statusesOf(t, out, 0)
	checkStatuses(t, out.at(0), shown, rule, 0)
	checkOneLimit(t, out.at(0), shown, alternate(len(shown), 2), 2, rule)
	run := runUntilDenied(t, nodes, len(shown), "/")
	where := fmt.Sprintf("the loop of %s (live: %v in %s)", out.at(0), run.statuses, run.elapsed)
	checkStatuses(t, where, run.statuses, rule, run.elapsed)
	checkOneLimit(t, where, run.statuses, run.node, 2, rule)

	// Stop Redis once the fleet view has seen both nodes (what a person
	// typing the next command gives it): the limit stays on.
	waitFleetView(t, nodes, 2)
	redis.Stop()
	cmd := need(t, blocks, "fallback-run")
	headers := regexp.MustCompile(`-H '([^']*)'`).FindAllStringSubmatch(cmd.text(), -1)
	var hs []string
	for _, h := range headers {
		hs = append(hs, h[1])
	}
	fout := need(t, blocks, "fallback-output")
	shown = statusesOf(t, fout, 0)
	checkFallback(t, fout.at(0), shown, alternate(len(shown), 2), time.Second, rule)
	run = runUntilDenied(t, nodes, len(shown), "/", hs...)
	checkFallback(t, fmt.Sprintf("the loop of %s (live: %v in %s)", fout.at(0), run.statuses, run.elapsed), run.statuses, run.node, run.elapsed, rule)

	// Each node logged the fallback with its divisor.
	logBlock := need(t, blocks, "fallback-log")
	want := logLineOf(t, logBlock)
	for k, n := range nodes {
		if !hasLogLine(n.Log.String(), want) {
			t.Errorf("%s: node %d did not log %s %q with %v; its log:\n%s", logBlock.at(0), k, want.level, want.msg, want.fields, n.Log.String())
		}
	}
}

// alternate is the nodes of the README's loop: request i to node i % n.
func alternate(requests, n int) []int {
	out := make([]int, requests)
	for i := range out {
		out[i] = (i + 1) % n
	}
	return out
}

// checkFallback checks a run on the nodes' own buckets: every node still
// denies, and the fleet admitted at most the burst and what the rate
// refilled over elapsed (each node's share of both, rounded down).
func checkFallback(t *testing.T, where string, statuses, node []int, elapsed time.Duration, rule tourRule) {
	t.Helper()
	denied := map[int]bool{}
	for i, s := range statuses {
		if s == http.StatusTooManyRequests {
			denied[node[i]] = true
		}
	}
	if len(denied) != 2 {
		t.Errorf("%s: the nodes that denied: %v; with Redis stopped the limit stays on at every node", where, denied)
	}
	if ok := count(statuses, http.StatusOK); ok > rule.burst+rule.refill(elapsed)+2 {
		t.Errorf("%s: %d passed; the limit allows %d and %d more over %s", where, ok, rule.burst, rule.refill(elapsed), elapsed)
	}
}

// waitFleetView waits until every node's stats show n nodes in the fleet
// view, then for the reports that follow (once a second) to count them.
func waitFleetView(t *testing.T, nodes []*localfleet.Node, n int) {
	t.Helper()
	if err := localfleet.WaitFleetView(nodes, n, 20*time.Second); err != nil {
		t.Fatal(err)
	}
}

// logLine is a log line as the README shows it (Caddy's console format):
// level, logger, message and the fields as JSON.
type logLine struct {
	level, logger, msg string
	fields             map[string]any
}

func logLineOf(t *testing.T, b tourBlock) logLine {
	t.Helper()
	m := regexp.MustCompile(`^(?:\S+ \S+\s+)?([A-Z]+)\s+(\S+)\s+(.*?)\s+(\{.*\})$`).FindStringSubmatch(strings.TrimSpace(b.lines[0]))
	if m == nil {
		t.Fatalf("%s: not a log line: level, logger, message, {fields}", b.at(0))
	}
	l := logLine{level: strings.ToLower(m[1]), logger: m[2], msg: m[3]}
	if err := json.Unmarshal([]byte(m[4]), &l.fields); err != nil {
		t.Fatalf("%s: the fields: %v", b.at(0), err)
	}
	return l
}

// hasLogLine reports whether a JSON log has the line: its level, logger,
// message and the fields shown (a line may have more).
func hasLogLine(log string, want logLine) bool {
	for _, l := range strings.Split(log, "\n") {
		var got map[string]any
		if json.Unmarshal([]byte(l), &got) != nil || got["msg"] != want.msg || got["level"] != want.level || got["logger"] != want.logger {
			continue
		}
		ok := true
		for k, v := range want.fields {
			ok = ok && reflect.DeepEqual(got[k], v)
		}
		if ok {
			return true
		}
	}
	return false
}
