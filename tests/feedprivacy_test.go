package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestDenialFeedPathNeedsLogKey: a token in a denied request's path
// reaches neither the admin API's feed, nor the zone's stream in Redis,
// nor the dashboard's data, unless the handler has log_key; without it a
// denial names the zone and what its matchers match instead.
func TestDenialFeedPathNeedsLogKey(t *testing.T) {
	t.Parallel()
	const token = "SECRET-TOKEN-123"
	for _, logKey := range []bool{false, true} {
		t.Run(fmt.Sprintf("log_key=%v", logKey), func(t *testing.T) {
			t.Parallel()
			r := redistest.Start(t)
			opt := ""
			if logKey {
				opt = "log_key"
			}
			n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		key_digest_secret %s
		%s
		redis {
			address %s
			timeout 2s
		}
		zone reset {
			key {header.X-Key}
			rate 1 1h
			match {
				path /reset/*
			}
		}
	}
	handle /ops/* {
		rate_limit_dashboard
	}
	respond "ok"`, digestSecret, opt, r.Addr))
			if got := n.statuses(3, "/reset/"+token, "X-Key: feed-user"); got[200] != 1 || got[429] != 2 {
				t.Fatalf("%v, want 1 admitted and 2 denied", got)
			}
			f, body := n.waitDenials("two denials from Redis", "?zone=reset", 20*time.Second, func(f denialFeed) bool {
				return len(f.Denials) == 2 && len(f.Stores) == 1 && f.Stores[0].Source == "fleet"
			})
			stream := r.MustDo("XRANGE", "rl:denials:{feed}:reset", "-", "+")
			site := map[string]string{}
			for _, p := range []string{"/ops/denials", "/ops/stats", "/ops/bans"} {
				resp := n.get(p)
				if resp.Status != 200 {
					t.Fatalf("GET %s: %d %s", p, resp.Status, resp.Body)
				}
				site[p] = resp.Body
			}
			if !strings.Contains(site["/ops/denials"], `"zone":"reset"`) {
				t.Errorf("the dashboard's feed lists no denial of zone reset:\n%s", site["/ops/denials"])
			}
			if !logKey {
				checkPathHidden(t, f, body, stream, site, token)
				return
			}
			checkPathShown(t, f, stream, site, token)
		})
	}
}

// checkPathHidden: without log_key, the token in the path shows in none
// of the admin API's feed body, the Redis stream and the dashboard's
// pages in site, and each denial names its zone and route instead.
func checkPathHidden(t *testing.T, f denialFeed, body, stream string, site map[string]string, token string) {
	t.Helper()
	if strings.Contains(body, token) {
		t.Errorf("the admin API's feed shows the path's token:\n%s", body)
	}
	if strings.Contains(stream, token) {
		t.Errorf("the Redis stream holds the path's token:\n%s", stream)
	}
	for p, b := range site {
		if strings.Contains(b, token) {
			t.Errorf("the dashboard's %s shows the path's token:\n%s", p, b)
		}
	}
	for _, d := range f.Denials {
		if d.Zone != "reset" || d.Path != "" || !strings.Contains(d.Route, "/reset/*") {
			t.Errorf("denial %+v: want zone reset, no path, the route /reset/*", d)
		}
	}
	if !strings.Contains(stream, "/reset/*") {
		t.Errorf("the Redis stream does not name the route:\n%s", stream)
	}
}

// checkPathShown: with log_key, the denials, the Redis stream and the
// dashboard's feed show the path with its token.
func checkPathShown(t *testing.T, f denialFeed, stream string, site map[string]string, token string) {
	t.Helper()
	for _, d := range f.Denials {
		if d.Path != "/reset/"+token {
			t.Errorf("with log_key, denial %+v: want the path /reset/%s", d, token)
		}
	}
	if !strings.Contains(stream, token) {
		t.Errorf("with log_key the Redis stream does not hold the path:\n%s", stream)
	}
	if !strings.Contains(site["/ops/denials"], token) {
		t.Errorf("with log_key the dashboard's feed does not show the path:\n%s", site["/ops/denials"])
	}
}
