package fleetlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

func adminGet(t *testing.T, method, path string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	w := httptest.NewRecorder()
	err := (&adminAPI{}).serve(w, httptest.NewRequest(method, path, nil))
	return w, err
}

func apiStatus(err error) int {
	var ae caddy.APIError
	if errors.As(err, &ae) {
		return ae.HTTPStatus
	}
	return 0
}

func TestAdminRoutes(t *testing.T) {
	t.Parallel()
	if r := (&adminAPI{}).Routes(); len(r) != 1 || r[0].Pattern != "/rate_limit/" {
		t.Fatalf("routes %+v", r)
	}
	for _, c := range []struct{ path, ctype, contains string }{
		{"/rate_limit/", "text/html; charset=utf-8", `<script src="dashboard.js" defer crossorigin="anonymous">`},
		{"/rate_limit/dashboard.js", "text/javascript; charset=utf-8", "fetch(\"stats\""},
		{"/rate_limit/dashboard.css", "text/css; charset=utf-8", "svg.chart"},
	} {
		w, err := adminGet(t, http.MethodGet, c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if got := w.Header().Get("Content-Type"); got != c.ctype {
			t.Errorf("%s: Content-Type %q, want %q", c.path, got, c.ctype)
		}
		if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: Content-Security-Policy %q", c.path, csp)
		}
		if !strings.Contains(w.Body.String(), c.contains) {
			t.Errorf("%s: body lacks %q", c.path, c.contains)
		}
	}
	// Every asset is embedded: nothing refers to another origin.
	for _, file := range dashboardFiles {
		body, _ := dashboardFS.ReadFile(file)
		for _, ref := range []string{"http://", "https://", "//cdn"} {
			if strings.Contains(strings.ReplaceAll(string(body), "http://www.w3.org/2000/svg", ""), ref) {
				t.Errorf("%s refers to %q: every asset must be embedded", file, ref)
			}
		}
	}
	if w, err := adminGet(t, http.MethodHead, "/rate_limit/"); err != nil || w.Body.Len() != 0 {
		t.Errorf("HEAD: err %v, body %d bytes", err, w.Body.Len())
	}
	if _, err := adminGet(t, http.MethodGet, "/rate_limit/nope"); apiStatus(err) != http.StatusNotFound {
		t.Errorf("unknown path: %v, want 404", err)
	}
	if _, err := adminGet(t, http.MethodPost, "/rate_limit/stats"); apiStatus(err) != http.StatusMethodNotAllowed {
		t.Errorf("POST: %v, want 405", err)
	}
	if _, err := adminGet(t, http.MethodGet, "/rate_limit/stats?series=9999"); apiStatus(err) != http.StatusBadRequest {
		t.Errorf("series=9999: %v, want 400", err)
	}
}

func TestAdminStatsJSON(t *testing.T) {
	t.Parallel()
	const zone = "unit_admin"
	h, _, _ := obsHandler(t, zoneConfig(zone, ""))
	for range 4 {
		serve(t, h, "x")
	}
	w, err := adminGet(t, http.MethodGet, "/rate_limit/stats?series=10")
	if err != nil {
		t.Fatal(err)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var body map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("%v: %s", err, w.Body.String())
	}
	var z map[string]any
	for _, v := range body["zones"].([]any) {
		if m := v.(map[string]any); m["name"] == zone {
			z = m
		}
	}
	if z == nil {
		t.Fatalf("zone %s missing: %s", zone, w.Body.String())
	}
	totals := z["totals"].(map[string]any)
	if totals["allowed"] != 3.0 || totals["denied"] != 1.0 {
		t.Errorf("totals %v", totals)
	}
	for _, window := range []string{"1s", "10s", "60s"} {
		if _, ok := z["rates"].(map[string]any)[window].(map[string]any)["denied"]; !ok {
			t.Errorf("rates lack the %s window: %v", window, z["rates"])
		}
	}
	if n := len(z["series"].(map[string]any)["allowed"].([]any)); n != 10 {
		t.Errorf("series of %d seconds, want 10", n)
	}
	var memory bool
	for _, s := range body["stores"].([]any) {
		m := s.(map[string]any)
		memory = memory || (m["name"] == "memory" && m["status"] == "ok")
	}
	if !memory {
		t.Errorf("stores %v lack the memory store", body["stores"])
	}
}

func TestCounterRing(t *testing.T) {
	t.Parallel()
	var r counterRing
	const base = 1_700_000_000
	for i := range 5 {
		r.add(base, limiter.Admitted)
		r.add(base+1, limiter.Denied)
		if i < 2 {
			r.add(base+2, limiter.FailedOpen)
		}
	}
	if c := r.sum(base+2, 3); c[limiter.Admitted] != 5 || c[limiter.Denied] != 5 || c[limiter.FailedOpen] != 2 {
		t.Fatalf("sum %v", c)
	}
	if c := r.sum(base+2, 1); c[limiter.Admitted] != 0 || c[limiter.FailedOpen] != 2 {
		t.Fatalf("last second %v", c)
	}
	// A slot reused a lap later starts from zero, and the old second is
	// gone; a second that has left the ring is not counted.
	lap := int64(len(r.slots))
	r.add(base+lap, limiter.Denied)
	if c := r.get(base + lap); c[limiter.Denied] != 1 || c[limiter.Admitted] != 0 {
		t.Fatalf("reused slot %v", c)
	}
	if c := r.get(base); c != ([limiter.NumOutcomes]uint64{}) {
		t.Fatalf("the overwritten second still reads %v", c)
	}
	r.add(base, limiter.Admitted)
	if c := r.get(base + lap); c[limiter.Admitted] != 0 {
		t.Fatalf("a late add for an old second landed in the new one: %v", c)
	}
}

func TestLatencyBuckets(t *testing.T) {
	t.Parallel()
	prev := time.Duration(0)
	for i := range latBuckets {
		up := latUpper(i)
		if up <= prev {
			t.Fatalf("bucket %d: upper bound %s not above %s", i, up, prev)
		}
		prev = up
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		d := time.Duration(rng.Int64N(int64(10 * time.Second)))
		i := latIndex(d)
		if d >= latUpper(i) || (i > 0 && d < latUpper(i-1)) {
			t.Fatalf("%s in bucket %d of [%s, %s)", d, i, latUpper(i-1), latUpper(i))
		}
		if i > 0 && float64(latUpper(i)-latUpper(i-1)) > 0.26*float64(latUpper(i)) {
			t.Fatalf("bucket %d is wider than a quarter of its bound", i)
		}
	}
	var s latencySummary
	for ms := 1; ms <= 100; ms++ {
		s.buckets[latIndex(time.Duration(ms)*time.Millisecond)]++
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{.5, 50 * time.Millisecond}, {.9, 90 * time.Millisecond}, {.99, 99 * time.Millisecond}} {
		got := s.quantile(c.q)
		if got < c.want || float64(got) > 1.26*float64(c.want) {
			t.Errorf("p%v = %s, want %s within a quarter", c.q*100, got, c.want)
		}
	}
	if (&latencySummary{}).quantile(.5) != 0 {
		t.Error("a quantile of nothing")
	}
}

// TestTopKeys: the sketch finds the heavy hitters among a flood of distinct
// keys, in bounded memory, and forgets them two windows later.
func TestTopKeys(t *testing.T) {
	t.Parallel()
	tk := newTopKeys()
	const sec = 1_700_000_040 + 40 // 40 s into a window
	heavy := map[string]int{"heavy-1": 900, "heavy-2": 600, "heavy-3": 300}
	var stream []string
	for k, n := range heavy {
		for range n {
			stream = append(stream, k)
		}
	}
	for i := range 20000 {
		stream = append(stream, fmt.Sprintf("noise-%d", i))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for _, k := range stream {
		tk.add(k, sec)
	}
	for i := range tk.shards {
		if n := len(tk.shards[i].cur.items); n > topPerShard || len(tk.shards[i].cur.idx) != n {
			t.Fatalf("shard %d holds %d items, index %d", i, n, len(tk.shards[i].cur.idx))
		}
	}
	top, since := tk.top(sec, 3)
	if since != sec-40-topWindow {
		t.Errorf("since %d, want the start of the previous window %d", since, sec-40-topWindow)
	}
	for i, want := range []string{"heavy-1", "heavy-2", "heavy-3"} {
		if i >= len(top) || top[i].key != want {
			t.Fatalf("top %+v, want heavy-1, heavy-2, heavy-3", top)
		}
		if n := uint64(heavy[want]); top[i].count < n || top[i].count-top[i].over > n {
			t.Errorf("%s: count %d (error %d), true count %d", want, top[i].count, top[i].over, n)
		}
	}
	// The next window still shows them; the one after has forgotten.
	tk.add("late", sec+topWindow)
	if top, _ := tk.top(sec+topWindow, 1); len(top) != 1 || top[0].key != "heavy-1" {
		t.Errorf("next window: %+v", top)
	}
	if top, _ := tk.top(sec+2*topWindow, 10); len(top) != 1 || top[0].key != "late" {
		t.Errorf("two windows later: %+v, want only the key of the last window", top)
	}
	tk.add("later", sec+5*topWindow)
	if top, _ := tk.top(sec+5*topWindow, 10); len(top) != 1 || top[0].key != "later" {
		t.Errorf("after a gap: %+v", top)
	}
}
