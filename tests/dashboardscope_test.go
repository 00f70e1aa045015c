package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// scopeSite is one of the two servers of TestDashboardScope: a zone of its
// own on /api/*, which bans a key for an hour after two denials, and a
// dashboard under /ops/ (taking dashboard's subdirectives); errors are
// answered with their message.
const scopeSite = `
http://127.0.0.1:%d {
	rate_limit {
		zone %s {
			key {header.X-Key}
			rate 1 1h
			ban 1h after 2 in 1m
			match {
				path /api/*
			}
		}
	}
	handle /ops/* {
		rate_limit_dashboard %s
	}
	handle_errors {
		respond "{http.error.message}" {http.error.status_code}
	}
	respond "ok"
}
`

// startScoped runs one Caddy with two servers, a (zone site_a, its
// dashboard configured with dashA) and b (zone site_b), on the memory
// store, and returns the process (serving a) and b's URL.
func startScoped(t *testing.T, dashA string) (*node, string) {
	t.Helper()
	admin := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	pa, pb := redistest.FreePort(t), redistest.FreePort(t)
	cfg := fmt.Sprintf("{\n\tadmin %s\n\tpersist_config off\n\tauto_https off\n}\n", admin) +
		fmt.Sprintf(scopeSite, pa, "site_a", dashA) + fmt.Sprintf(scopeSite, pb, "site_b", "")
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	n := localfleet.StartFile(t, caddyBin, file, admin, pa)
	return &node{Node: n, t: t, log: n.Log}, fmt.Sprintf("http://127.0.0.1:%d", pb)
}

// banOn bans key in the zone of the server at url (three requests: one
// admitted, two denied, the second of which starts the ban).
func banOn(t *testing.T, url, key string) {
	t.Helper()
	for range 4 {
		if _, err := getURL(url+"/api/x", "X-Key: "+key); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := getURL(url+"/api/x", "X-Key: "+key)
	if err != nil || resp.Status != 429 || !strings.Contains(resp.Body, "banned") {
		t.Fatalf("%s: %+v %v, want the key banned", url, resp, err)
	}
}

// getURL sends a GET with a header ("Name: value") to url.
func getURL(url, header string) (response, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return response{}, err
	}
	name, value, _ := strings.Cut(header, ": ")
	req.Header.Set(name, value)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}, err
}

// TestDashboardScope: a site's rate_limit_dashboard shows and lifts the
// bans of its own server's zones only: another server's zone is neither
// in its stats nor in its bans, and lifting its ban answers 404 with a
// reason; the admin API and a dashboard with `scope all` reach both.
func TestDashboardScope(t *testing.T) {
	t.Parallel()
	const key = "scope-user"
	a, bURL := startScoped(t, "")
	banOn(t, a.URL, key)
	banOn(t, bURL, key)

	stats := a.get("/ops/stats?series=0")
	var s struct {
		Zones []struct{ Name string } `json:"zones"`
	}
	if err := json.Unmarshal([]byte(stats.Body), &s); err != nil || len(s.Zones) != 1 || s.Zones[0].Name != "site_a" {
		t.Errorf("a's dashboard stats list zones %+v (%v), want site_a only", s.Zones, err)
	}
	bans := a.get("/ops/bans").Body
	if !strings.Contains(bans, `"zone":"site_a"`) || strings.Contains(bans, "site_b") {
		t.Errorf("a's dashboard bans: %s, want site_a's only", bans)
	}
	// The feed lists a's denials, not b's.
	if feed := a.get("/ops/denials").Body; !strings.Contains(feed, "site_a") || strings.Contains(feed, "site_b") {
		t.Errorf("a's dashboard feed: %s, want site_a's denials only", feed)
	}
	resp := a.do(http.MethodDelete, "/ops/bans?zone=site_b&key="+key)
	if resp.Status != 404 || !strings.Contains(resp.Body, "server") {
		t.Errorf("a's dashboard lifting site_b's ban: %d %q, want 404 saying the zone is not this server's", resp.Status, resp.Body)
	}
	if r, _ := getURL(bURL+"/api/x", "X-Key: "+key); !strings.Contains(r.Body, "banned") {
		t.Errorf("site_b's ban after a's dashboard tried to lift it: %d %q, want still banned", r.Status, r.Body)
	}
	// The admin API is process-wide.
	if all := a.adminGet("/rate_limit/bans"); !strings.Contains(all, "site_a") || !strings.Contains(all, "site_b") {
		t.Errorf("the admin API's bans: %s, want both zones", all)
	}
	if resp := a.do(http.MethodDelete, "/ops/bans?zone=site_a&key="+key); resp.Status != 200 {
		t.Errorf("a's dashboard lifting site_a's ban: %d %q", resp.Status, resp.Body)
	}

	// scope all: the dashboard reaches every server's zones.
	a2, b2URL := startScoped(t, "{\n\t\t\tscope all\n\t\t}")
	banOn(t, b2URL, key)
	if bans := a2.get("/ops/bans").Body; !strings.Contains(bans, "site_b") {
		t.Errorf("scope all: bans %s, want site_b's", bans)
	}
	if resp := a2.do(http.MethodDelete, "/ops/bans?zone=site_b&key="+key); resp.Status != 200 || !strings.Contains(resp.Body, `"zone":"site_b"`) {
		t.Errorf("scope all: lifting site_b's ban: %d %q, want it lifted", resp.Status, resp.Body)
	}
}
