//go:build unix

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// dashboardState is what the test reads of the dashboard's DOM.
type dashboardState struct {
	Updates int    `json:"updates"`
	Status  string `json:"status"`
	Stores  []struct {
		Name  string `json:"name"`
		Badge string `json:"badge"`
	} `json:"stores"`
	Zones []struct {
		Name        string   `json:"name"`
		LocalDenied string   `json:"localDenied"`
		LocalSum    int      `json:"localSum"`
		LocalEnd    int64    `json:"localEnd"`
		FleetSum    int      `json:"fleetSum"`
		FleetTitle  string   `json:"fleetTitle"`
		Rows        []string `json:"rows"`
		TopKey      string   `json:"topKey"`
		TopCount    string   `json:"topCount"`
	} `json:"zones"`
}

const readDashboard = `(() => {
  const q = (root, sel) => root.querySelector(sel);
  if (!document.getElementById("status")) return {updates: 0, status: "loading", stores: [], zones: []};
  return {
    updates: Number(document.body.dataset.updates),
    status: document.getElementById("status").textContent,
    stores: [...document.querySelectorAll(".store")].map(s => ({name: s.dataset.store, badge: q(s, ".badge").textContent})),
    zones: [...document.querySelectorAll("section.zone")].map(z => {
      const local = q(z, "svg.chart.local"), fleet = q(z, "svg.chart.fleet");
      const first = q(z, "table.top tbody tr:not(.none)");
      return {
        name: z.dataset.zone,
        localDenied: q(local, "path.denied").getAttribute("d") || "",
        localSum: Number(local.dataset.deniedSum || 0),
        localEnd: Number(local.dataset.end || 0),
        fleetSum: Number(fleet.dataset.deniedSum || 0),
        fleetTitle: q(z, ".panel.fleet h3").textContent,
        rows: [...z.querySelectorAll("table.top tbody tr")].map(tr => tr.textContent),
        topKey: first ? q(first, "td.key").textContent : "",
        topCount: first ? q(first, "td.n").textContent : "",
      };
    }),
  };
})()`

// TestDashboardInChromium opens the dashboard of one of two nodes sharing a
// Redis in headless Chromium while both are denied requests, and checks
// that the page polls, that the chart and the top keys table change with
// the load, and that the fleet view counts both nodes. It keeps a
// screenshot. It does not run in parallel: a browser and a steady load are
// a lot for a small machine, and the suite's latency tests should not pay
// for them.
func TestDashboardInChromium(t *testing.T) {
	bin := requireChromium(t)
	r := redistest.Start(t)
	site := fmt.Sprintf(`
	rate_limit {
		key_digest_secret test-digest-secret
		redis {
			address %s
			timeout 1s
		}
		zone api {
			key {header.X-Key}
			rate 10 1s
		}
		zone login {
			key {header.X-Key}
			rate 2 1s
			match {
				path /login
			}
		}
	}
	respond "ok"`, r.Addr)
	a, b := startCaddy(t, "", site), startCaddy(t, "", site)

	// Load on both nodes until the test ends.
	loadDashboard(t, a, b)

	// Caddy's admin endpoint refuses browser requests that carry neither
	// Origin nor Referer, as a typed URL does, unless the empty origin is
	// allowed: the configuration docs/observability.md gives for the dashboard.
	a.allowAdminOrigins(a.Admin, "")

	page, output := openPage(t, bin, "http://"+a.Admin+"/rate_limit/")

	read := func() dashboardState { return readPage[dashboardState](t, page, output, readDashboard) }

	first := waitForPage(t, "both zones with denials", 15*time.Second, read, func(s dashboardState) bool {
		i, j := dashboardZone(s, "api"), dashboardZone(s, "login")
		return s.Updates >= 1 && i >= 0 && j >= 0 && s.Zones[i].LocalSum > 0 && s.Zones[i].TopKey != ""
	})
	if !strings.HasPrefix(first.Status, "live") {
		t.Errorf("status %q, want live", first.Status)
	}
	if len(first.Stores) != 1 || first.Stores[0].Name != "redis:"+r.Addr || first.Stores[0].Badge != "ok" {
		t.Errorf("store panel %+v", first.Stores)
	}
	// Keys are digests unless log_key: mallory is denied most.
	api := first.Zones[dashboardZone(first, "api")]
	if api.TopKey != keyDigest("mallory") || len(api.Rows) < 2 {
		t.Errorf("top denied in api: first %q (want mallory's digest %q), rows %q", api.TopKey, keyDigest("mallory"), api.Rows)
	}

	checkDashboardFollowsLoad(t, read, first)

	saveDashboardScreenshot(t, page)
}

// checkDashboardFollowsLoad: seconds after first, the page has polled
// about once a second, the chart has moved on and holds more denials, the
// table's counts grew, and the fleet panel counts both nodes and their
// denials.
func checkDashboardFollowsLoad(t *testing.T, read func() dashboardState, first dashboardState) {
	t.Helper()
	api := first.Zones[dashboardZone(first, "api")]
	time.Sleep(2500 * time.Millisecond)
	later := waitForPage(t, "the fleet's denials from two nodes", 15*time.Second, read, func(s dashboardState) bool {
		i := dashboardZone(s, "api")
		return i >= 0 && s.Zones[i].FleetSum > 0 && strings.Contains(s.Zones[i].FleetTitle, "2 nodes")
	})
	api2 := later.Zones[dashboardZone(later, "api")]
	if later.Updates < first.Updates+2 {
		t.Errorf("%d updates, then %d 2.5 s later: the page does not poll every second", first.Updates, later.Updates)
	}
	if api2.LocalDenied == api.LocalDenied || api2.LocalEnd <= api.LocalEnd || api2.LocalSum <= api.LocalSum {
		t.Errorf("the chart did not move: end %d -> %d, denied %d -> %d", api.LocalEnd, api2.LocalEnd, api.LocalSum, api2.LocalSum)
	}
	if api2.TopKey != api.TopKey || api2.TopCount == api.TopCount {
		t.Errorf("the table did not update: %q %q -> %q %q", api.TopKey, api.TopCount, api2.TopKey, api2.TopCount)
	}
	// The fleet view lags a couple of seconds behind the node's own
	// counts (each node reports the seconds that are complete): with two
	// nodes under the same load it soon holds more than half of what this
	// node alone counts.
	waitForPage(t, "fleet denials above half of this node's", 10*time.Second, read, func(s dashboardState) bool {
		i := dashboardZone(s, "api")
		return i >= 0 && s.Zones[i].FleetSum > s.Zones[i].LocalSum/2
	})
}

// loadDashboard loads both nodes until the test ends: "mallory" floods and
// is denied most, "eve" a little less, the others stay within the limit.
func loadDashboard(t *testing.T, a, b *node) {
	ctx, stopLoad := context.WithTimeout(context.Background(), 10*time.Minute)
	var wg sync.WaitGroup
	t.Cleanup(func() { stopLoad(); wg.Wait() })
	for i, nd := range []*node{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			client := &http.Client{Timeout: 5 * time.Second}
			for ctx.Err() == nil {
				key, path := "mallory", "/"
				switch x := rng.IntN(10); {
				case x < 3:
					key = "eve"
				case x < 4:
					key, path = fmt.Sprintf("user-%d", rng.IntN(20)), "/"
				case x < 5:
					key, path = "mallory", "/login"
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, nd.URL+path, nil)
				req.Header.Set("X-Key", key)
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
				}
				time.Sleep(8 * time.Millisecond)
			}
		}()
	}
}

// dashboardZone is the index of the zone name in s, or -1.
func dashboardZone(s dashboardState, name string) int {
	for i := range s.Zones {
		if s.Zones[i].Name == name {
			return i
		}
	}
	return -1
}

// saveDashboardScreenshot keeps a screenshot of page, after
// FLEETLIMIT_DASHBOARD_SECONDS more of load if it is set.
func saveDashboardScreenshot(t *testing.T, page context.Context) {
	// FLEETLIMIT_DASHBOARD_SECONDS keeps the load and the page running
	// longer before the screenshot, so that the charts fill up (how
	// docs/dashboard.png is made).
	if v := os.Getenv("FLEETLIMIT_DASHBOARD_SECONDS"); v != "" {
		secs, _ := strconv.Atoi(v)
		time.Sleep(time.Duration(min(secs, 600)) * time.Second)
	}
	c, cancel := context.WithTimeout(page, 15*time.Second)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Fatalf("screenshot of %d bytes is not a PNG of a page", len(png))
	}
	path, err := saveArtifact("dashboard.png", png)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshot: %s", path)
}

// requireChromium returns the Chromium to run (findChromium), and fails
// the test if there is none.
func requireChromium(t *testing.T) string {
	t.Helper()
	bin := findChromium()
	if bin == "" {
		t.Fatal("chromium is required by this test and is not installed (.ci/run installs it: apt-get install chromium)")
	}
	return bin
}

// findChromium returns the Chromium to run: $CHROMIUM if set, else
// Debian's /usr/bin/chromium, else the first of the usual names on PATH;
// "" if there is none.
func findChromium() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// openPage starts bin headless with a fresh profile and a viewport of
// 1360x1000 pixels, and loads pageURL in its tab. The returned context is
// the tab: run actions on it with a timeout derived from it. The browser
// stops when the test ends; output is what it printed, for error messages.
func openPage(t *testing.T, bin, pageURL string) (page context.Context, output fmt.Stringer) {
	t.Helper()
	out := &localfleet.SyncBuffer{}
	// No user-data-dir flag: the allocator makes a fresh profile directory
	// for the browser and removes it, after the browser's helper processes,
	// when the browser stops.
	alloc, stopAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(bin),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("force-device-scale-factor", "1"),
		chromedp.WindowSize(1360, 1000),
		chromedp.CombinedOutput(out),
	)
	t.Cleanup(stopAlloc)
	page, stopPage := chromedp.NewContext(alloc)
	t.Cleanup(stopPage)
	// The browser lives as long as the context of the first Run, so that
	// one takes no deadline: a timer bounds the start and the load instead.
	// The viewport is set rather than left to the window, whose headless
	// tabs lose a strip of varying height to bars nobody sees (861 or 913
	// pixels of 1000): the screenshot is always 1360x1000, the whole page.
	const limit = 30 * time.Second
	timer := time.AfterFunc(limit, stopPage)
	err := chromedp.Do(page, chromedp.EmulateViewport(1360, 1000), chromedp.Navigate(pageURL))
	if !timer.Stop() {
		t.Fatalf("chromium did not start and load %s in %v: %v\nchromium output:\n%s", pageURL, limit, err, out)
	}
	if err != nil {
		t.Fatalf("loading %s in chromium: %v\nchromium output:\n%s", pageURL, err, out)
	}
	return page, out
}

// readPage evaluates js in page, a tab from openPage, and returns its
// value; it fails the test, with chromium's output, if it cannot.
func readPage[S any](t *testing.T, page context.Context, output fmt.Stringer, js string) S {
	t.Helper()
	c, cancel := context.WithTimeout(page, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(c, chromedp.Evaluate[S](js))
	if err != nil {
		t.Fatalf("reading the dashboard: %v\nchromium output:\n%s", err, output)
	}
	return s
}

// waitForPage reads the page every 200 ms until cond holds of what read
// returns, and returns that; it fails the test if cond does not hold
// within timeout (what: what the test waits to see).
func waitForPage[S any](t *testing.T, what string, timeout time.Duration, read func() S, cond func(S) bool) S {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := read()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard never showed %s; it shows %+v", what, s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// saveArtifact writes data to the file name in the directory where tests
// keep what a person may want to look at afterwards: $FLEETLIMIT_ARTIFACTS,
// or fleetlimit-artifacts in the system's temporary directory (created if
// need be). It returns the file's path.
func saveArtifact(name string, data []byte) (string, error) {
	dir := os.Getenv("FLEETLIMIT_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "fleetlimit-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, data, 0o644)
}

// allowAdminOrigins sets the admin endpoint's allowed origins through the
// admin API, as `admin { origins ... }` in the Caddyfile would, and waits
// for the restarted endpoint.
func (n *node) allowAdminOrigins(origins ...string) {
	n.t.Helper()
	body, _ := json.Marshal(origins)
	req, _ := http.NewRequest(http.MethodPut, "http://"+n.Admin+"/config/admin/origins", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		n.t.Fatalf("setting admin origins: %v", err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		n.t.Fatalf("setting admin origins: %d %s", resp.StatusCode, msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + n.Admin + "/config/admin/origins")
		if err == nil {
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && bytes.Equal(bytes.TrimSpace(got), body) {
				return
			}
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the admin endpoint did not come back with origins %q", origins)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
