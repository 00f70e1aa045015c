package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// sourceClient sends requests from a loopback address of its own (Linux
// routes all of 127.0.0.0/8 to the loopback interface), so that Caddy sees
// that address as the connection's peer.
type sourceClient struct {
	t  *testing.T
	cl *http.Client
}

func newSourceClient(t *testing.T, src string) *sourceClient {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	return &sourceClient{t: t, cl: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// get sends a GET to n's path with headers ("Name: value").
func (c *sourceClient) get(n *node, path string, headers ...string) response {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, n.URL+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := c.cl.Do(req)
	if err != nil {
		c.t.Fatalf("GET %s: %v\ncaddy output:\n%s", path, err, n.log.String())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}
}

// statuses sends count GETs and returns how many got each status, and
// whether any response carried a rate limit field.
func (c *sourceClient) statuses(n *node, count int, path string, headers ...string) (map[int]int, bool) {
	c.t.Helper()
	got, fields := map[int]int{}, false
	for range count {
		r := c.get(n, path, headers...)
		got[r.Status]++
		fields = fields || hasRateLimitFields(r.Header)
	}
	return got, fields
}

func hasRateLimitFields(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "ratelimit") || strings.HasPrefix(strings.ToLower(k), "x-ratelimit") {
			return true
		}
	}
	return false
}

// TestExempt runs a real Caddy whose handler exempts one loopback address
// and one of whose zones exempts a network that only a trusted proxy can
// name (X-Forwarded-For): exempt clients pass whatever their buckets hold,
// get no fields of the zones that exempt them, are charged nothing, are
// counted under the outcome exempt, and no client can claim an exempt
// address: neither one that is not the trusted proxy, nor one behind it
// that sends its own X-Forwarded-For.
func TestExempt(t *testing.T) {
	t.Parallel()
	globals := `	servers {
		trusted_proxies static 127.0.0.3/32
		trusted_proxies_strict
		client_ip_headers X-Forwarded-For
	}`
	n := startCaddy(t, globals, `
	rate_limit {
		exempt 127.0.0.2
		zone per_client {
			key {header.X-Key}
			rate 3 1h
		}
		zone login {
			key {header.X-Key}
			rate 2 1h
			exempt 192.0.2.0/24
			match {
				path /login
			}
		}
	}
	respond "ok"`)
	direct := newSourceClient(t, "127.0.0.1")
	exempt := newSourceClient(t, "127.0.0.2")
	proxy := newSourceClient(t, "127.0.0.3")
	want := func(what string, got map[int]int, fields bool, ok, denied int, wantFields bool) {
		t.Helper()
		if got[200] != ok || got[429] != denied || len(got) > 2 || fields != wantFields {
			t.Errorf("%s: statuses %v, rate limit fields %v; want %d 200, %d 429, fields %v", what, got, fields, ok, denied, wantFields)
		}
	}

	// A limited client spends k1's bucket; the exempt address passes on
	// the same key, with no fields.
	got, fields := direct.statuses(n, 5, "/", "X-Key: k1")
	want("127.0.0.1 k1", got, fields, 3, 2, true)
	got, fields = exempt.statuses(n, 10, "/", "X-Key: k1")
	want("127.0.0.2 k1 (exempt, bucket empty)", got, fields, 10, 0, false)
	// An exempt client is charged nothing: k2 is full afterwards.
	got, fields = exempt.statuses(n, 10, "/login", "X-Key: k2")
	want("127.0.0.2 k2 on /login (exempt from both zones)", got, fields, 10, 0, false)
	got, fields = direct.statuses(n, 4, "/", "X-Key: k2")
	want("127.0.0.1 k2 after the exempt requests", got, fields, 3, 1, true)
	// Behind the trusted proxy, 192.0.2.9 is exempt from login only: the
	// fields name per_client alone, and per_client limits it.
	r := proxy.get(n, "/login", "X-Key: k3", "X-Forwarded-For: 192.0.2.9")
	if pol := r.Header.Get("RateLimit-Policy"); r.Status != 200 || !strings.Contains(pol, `"per_client"`) || strings.Contains(pol, "login") {
		t.Errorf("192.0.2.9 on /login: %d, RateLimit-Policy %q; want 200 naming per_client alone", r.Status, pol)
	}
	got, _ = proxy.statuses(n, 3, "/login", "X-Key: k3", "X-Forwarded-For: 192.0.2.9")
	want("192.0.2.9 via the proxy on /login", got, true, 2, 1, true)
	// The proxy forwards for the exempt address: exempt.
	got, fields = proxy.statuses(n, 5, "/", "X-Key: k4", "X-Forwarded-For: 127.0.0.2")
	want("127.0.0.2 via the proxy", got, fields, 5, 0, false)
	// A client that is not the trusted proxy cannot claim it.
	got, fields = direct.statuses(n, 4, "/", "X-Key: k5", "X-Forwarded-For: 127.0.0.2")
	want("127.0.0.1 claiming 127.0.0.2", got, fields, 3, 1, true)
	// Nor can a client behind the proxy, by sending its own
	// X-Forwarded-For that the proxy appends to: trusted_proxies_strict
	// reads the header from the right.
	got, fields = proxy.statuses(n, 4, "/", "X-Key: k6", "X-Forwarded-For: 127.0.0.2, 198.51.100.50")
	want("198.51.100.50 forging 127.0.0.2 through the proxy", got, fields, 3, 1, true)

	checkExemptCounted(t, n)
}

// checkExemptCounted: the metrics and the stats count TestExempt's exempt
// requests, and the near-limit admissions, by zone.
func checkExemptCounted(t *testing.T, n *node) {
	t.Helper()
	m := n.scrape()
	wantMetric(t, m, 25, "caddy_rate_limit_decisions_total", "zone", "per_client", "outcome", "exempt")
	wantMetric(t, m, 14, "caddy_rate_limit_decisions_total", "zone", "login", "outcome", "exempt")
	wantMetric(t, m, 15, "caddy_rate_limit_decisions_total", "zone", "per_client", "outcome", "allowed")
	wantMetric(t, m, 6, "caddy_rate_limit_decisions_total", "zone", "per_client", "outcome", "denied")
	wantMetric(t, m, 0, "caddy_rate_limit_decisions_total", "zone", "login", "outcome", "allowed")
	// Each of the five limited keys left per_client's burst of 3 near
	// its limit once (0 left < 20% of 3); login admitted nothing.
	wantMetric(t, m, 5, "caddy_rate_limit_near_limit_total", "zone", "per_client")
	wantMetric(t, m, 0, "caddy_rate_limit_near_limit_total", "zone", "login")

	// The stats count them too.
	var s struct {
		Zones []struct {
			Name      string `json:"name"`
			Exempt    uint64 `json:"exempt"`
			NearLimit uint64 `json:"near_limit"`
		} `json:"zones"`
	}
	body := n.adminGet("/rate_limit/stats")
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	counts := map[string][2]uint64{}
	for _, z := range s.Zones {
		counts[z.Name] = [2]uint64{z.Exempt, z.NearLimit}
	}
	if counts["per_client"] != [2]uint64{25, 5} || counts["login"] != [2]uint64{14, 0} {
		t.Errorf("stats (exempt, near_limit) by zone: %v", counts)
	}
}

// TestNearLimitWindow counts near-limit admissions of a fixed window: with
// a limit of 10, the requests that leave 1 and 0 are near it (less than 2
// left), those that leave 2 or more are not.
func TestNearLimitWindow(t *testing.T) {
	t.Parallel()
	n := startCaddy(t, "", `
	rate_limit {
		zone win {
			key {header.X-Key}
			algorithm fixed_window
			rate 10 1h
		}
	}
	respond "ok"`)
	if got := n.statuses(12, "/", "X-Key: w"); got[200] != 10 || got[429] != 2 {
		t.Fatalf("statuses %v, want 10 admitted and 2 denied", got)
	}
	wantMetric(t, n.scrape(), 2, "caddy_rate_limit_near_limit_total", "zone", "win")
}

// evalCalls is how many scripts Redis has run (EVALSHA and EVAL calls).
func evalCalls(t *testing.T, r *redistest.Server) int {
	t.Helper()
	info := r.MustDo("INFO", "commandstats")
	total := 0
	for _, m := range regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total
}

// TestExemptNoStoreCall checks on a real Redis that an exempt request costs
// nothing there: a request exempt from every zone runs no script, and one
// exempt from a zone leaves no bucket of that zone behind.
func TestExemptNoStoreCall(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
		}
		exempt 127.0.0.2
		zone exz_all {
			key {header.X-Key}
			rate 2 1h
		}
		zone exz_zone {
			key {header.X-Key}
			rate 2 1h
			exempt 127.0.0.4
		}
	}
	respond "ok"`, r.Addr))
	// One decision first, so that the script is loaded.
	if got := n.get("/", "X-Key: warm"); got.Status != 200 {
		t.Fatalf("warm-up: %d", got.Status)
	}
	before := evalCalls(t, r)
	got, fields := newSourceClient(t, "127.0.0.2").statuses(n, 20, "/", "X-Key: e")
	if got[200] != 20 || fields {
		t.Errorf("exempt client: %v, fields %v; want 20 admitted, no fields", got, fields)
	}
	if after := evalCalls(t, r); after != before {
		t.Errorf("20 requests exempt from every zone ran %d scripts in Redis, want none", after-before)
	}
	// Exempt from exz_zone only: exz_all limits it, and no exz_zone
	// bucket of its key appears.
	got, fields = newSourceClient(t, "127.0.0.4").statuses(n, 4, "/", "X-Key: z")
	if got[200] != 2 || got[429] != 2 || !fields {
		t.Errorf("client exempt from one zone: %v, fields %v; want 2 admitted, 2 denied, with fields", got, fields)
	}
	// The warm-up's key has a bucket in each zone; z in exz_all only.
	if keys := strings.Fields(r.MustDo("KEYS", "*exz_zone*")); len(keys) != 1 {
		t.Errorf("exz_zone's buckets in Redis: %q, want the warm-up's alone", keys)
	}
	if keys := strings.Fields(r.MustDo("KEYS", "*exz_all*")); len(keys) != 2 {
		t.Errorf("exz_all's buckets in Redis: %q, want the warm-up's and z's", keys)
	}
	m := n.scrape()
	wantMetric(t, m, 24, "caddy_rate_limit_decisions_total", "zone", "exz_zone", "outcome", "exempt")
	wantMetric(t, m, 20, "caddy_rate_limit_decisions_total", "zone", "exz_all", "outcome", "exempt")
}
