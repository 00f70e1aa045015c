//go:build unix

package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// banRows is what the test reads of the dashboard's bans.
type banRows struct {
	Updates int      `json:"updates"`
	Lifted  int      `json:"lifted"`
	Keys    []string `json:"keys"`
	Zones   []string `json:"zones"`
	Note    string   `json:"note"`
}

const readBans = `(() => {
  const s = document.getElementById("bans");
  if (!s) return {updates: 0, lifted: 0, keys: [], zones: [], note: ""};
  const rows = [...s.querySelectorAll("tr.ban")];
  return {
    updates: Number(s.dataset.updates || 0),
    lifted: Number(s.dataset.lifted || 0),
    keys: rows.map(r => r.querySelector("td.key").textContent),
    zones: rows.map(r => r.dataset.zone),
    note: document.getElementById("ban-note").textContent,
  };
})()`

// TestDashboardBansInChromium: the dashboard of one of two nodes lists a
// ban that the other node started (the key's digest, not the key), and its
// button lifts it: the row goes, and neither node answers the key banned.
// Not in parallel, like TestDashboardInChromium: one browser at a time.
func TestDashboardBansInChromium(t *testing.T) {
	bin := requireChromium(t)
	r := redistest.Start(t)
	site := fmt.Sprintf(banSite, digestSecret, r.Addr)
	a, b := startCaddy(t, "", site), startCaddy(t, "", site)
	const key = "sk_live_troll"
	banKey(t, b, "/long", key)
	if resp := a.get("/long", "X-Key: "+key); !banned(resp) {
		t.Fatalf("node a: %d %q, want banned", resp.Status, resp.Body)
	}

	a.allowAdminOrigins(a.Admin, "")
	page, output := openPage(t, bin, "http://"+a.Admin+"/rate_limit/")
	read := func() banRows { return readPage[banRows](t, page, output, readBans) }
	waitFor := func(what string, cond func(banRows) bool) banRows {
		t.Helper()
		return waitForPage(t, what, 15*time.Second, read, cond)
	}

	s := waitFor("the ban", func(s banRows) bool { return len(s.Keys) == 1 })
	if s.Keys[0] != keyDigest(key) || s.Zones[0] != "long" {
		t.Errorf("the bans table shows %q in %q, want %s's digest %q in long", s.Keys, s.Zones, key, keyDigest(key))
	}
	c, cancel := context.WithTimeout(page, 10*time.Second)
	defer cancel()
	// A screenshot of the list, for a person to look at.
	if png, err := chromedp.Run(c, chromedp.CaptureScreenshot()); err == nil {
		if path, err := saveArtifact("dashboard-bans.png", png); err == nil {
			t.Logf("dashboard screenshot: %s", path)
		}
	}
	clicked, err := chromedp.Run(c, chromedp.Evaluate[bool](`(() => {
  const b = document.querySelector("#bans tr.ban button.lift");
  if (!b) return false;
  b.click();
  return true;
})()`))
	if err != nil || !clicked {
		t.Fatalf("clicking lift: %v, %v\nchromium output:\n%s", clicked, err, output)
	}
	s = waitFor("the ban lifted", func(s banRows) bool { return s.Lifted == 1 && len(s.Keys) == 0 })
	if s.Note != "" {
		t.Errorf("the lift says %q", s.Note)
	}
	time.Sleep(300 * time.Millisecond) // the channel's message to node b
	for name, n := range map[string]*node{"a": a, "b": b} {
		if resp := n.get("/long", "X-Key: "+key); banned(resp) || strings.Contains(resp.Body, "banned") {
			t.Errorf("node %s after the lift: %d %q, want no ban", name, resp.Status, resp.Body)
		}
	}
}
