//go:build unix

package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// keyRows is what the test reads of the dashboard's key lookup.
type keyRows struct {
	Lookups   int      `json:"lookups"`
	Resets    int      `json:"resets"`
	Remaining []string `json:"remaining"`
	Note      string   `json:"note"`
	// MemoryStore is the memory store's card: "kind … keys 1 of 500,000".
	MemoryStore string `json:"memoryStore"`
}

const readKeys = `(() => {
  const s = document.getElementById("keys");
  const m = document.querySelector('.store[data-store="memory"]');
  if (!s) return {lookups: 0, resets: 0, remaining: [], note: "", memoryStore: ""};
  return {
    lookups: Number(s.dataset.lookups || 0),
    resets: Number(s.dataset.resets || 0),
    remaining: [...s.querySelectorAll("tr.key-row td.key-remaining")].map(td => td.textContent),
    note: document.getElementById("key-note").textContent,
    memoryStore: m ? m.textContent : "",
  };
})()`

// TestDashboardKeysInChromium: the dashboard's lookup box shows a drained
// key's bucket (0 remaining; a key of 910 bytes), and its reset button
// makes it full again:
// the table shows the burst, and the node admits the key. The memory
// store's card shows its bound as max_keys is written (the default,
// 500,000), not as the store rounds it to its shards.
// Not in parallel, like TestDashboardInChromium: one browser at a time.
func TestDashboardKeysInChromium(t *testing.T) {
	bin := requireChromium(t)
	n := startCaddy(t, "", fmt.Sprintf(keySite, digestSecret, ""))
	key := "cust-dash-" + strings.Repeat("x", 900) // as long as a JWT: the box sends it as the body
	drainEverywhere(t, []*node{n}, key)

	n.allowAdminOrigins(n.Admin, "")
	page, output := openPage(t, bin, "http://"+n.Admin+"/rate_limit/")
	read := func() keyRows { return readPage[keyRows](t, page, output, readKeys) }
	c, cancel := context.WithTimeout(page, 20*time.Second)
	defer cancel()
	click := func(js string) {
		t.Helper()
		for range 50 { // the section is built once keys.js has run
			ok, err := chromedp.Run(c, chromedp.Evaluate[bool](js))
			if err != nil {
				t.Fatalf("the dashboard: %v\nchromium output:\n%s", err, output)
			}
			if ok {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("the dashboard has no lookup box\nchromium output:\n%s", output)
	}
	click(`(() => {
  const z = document.getElementById("key-zone"), k = document.getElementById("key-key");
  if (!z || !k) return false;
  z.value = "api";
  k.value = "` + key + `";
  document.getElementById("key-look").click();
  return true;
})()`)
	s := waitForPage(t, "the lookup", 15*time.Second, read, func(s keyRows) bool { return s.Lookups >= 1 })
	if len(s.Remaining) != 1 || s.Remaining[0] != "0" || s.Note != "" {
		t.Fatalf("the lookup of the drained key shows %+v, want one bucket with 0 remaining", s)
	}
	if !strings.Contains(s.MemoryStore, "keys 1 of 500,000") {
		t.Errorf("the memory store's card reads %q, want its one key of the default max_keys: \"keys 1 of 500,000\"", s.MemoryStore)
	}
	if png, err := chromedp.Run(c, chromedp.CaptureScreenshot()); err == nil {
		if path, err := saveArtifact("dashboard-keys.png", png); err == nil {
			t.Logf("dashboard screenshot: %s", path)
		}
	}
	click(`(() => { document.getElementById("key-reset").click(); return true; })()`)
	s = waitForPage(t, "the reset", 15*time.Second, read, func(s keyRows) bool { return s.Resets == 1 && s.Lookups >= 2 })
	if len(s.Remaining) != 1 || s.Remaining[0] != "5" || s.Note != "" {
		t.Errorf("after the reset the lookup shows %+v, want 5 remaining", s)
	}
	if got := n.get("/x", "X-Key: "+key).Status; got != 200 {
		t.Errorf("the key reset from the dashboard answers %d", got)
	}
}
