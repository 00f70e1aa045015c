package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// adminStale is the part of the admin API's answers that says how fresh
// they are.
type adminStale struct {
	Zones []struct {
		Name  string `json:"name"`
		Fleet *struct {
			Nodes  []string   `json:"nodes"`
			Stale  bool       `json:"stale"`
			ReadAt *time.Time `json:"read_at"`
			Error  string     `json:"error"`
		} `json:"fleet"`
	} `json:"zones"`
	Stores []struct {
		Kind      string     `json:"kind"`
		Source    string     `json:"source"`
		Status    string     `json:"status"`
		Breaker   string     `json:"breaker"`
		Stale     bool       `json:"stale"`
		ReadAt    *time.Time `json:"read_at"`
		Error     string     `json:"error"`
		LastError *struct {
			Message string `json:"message"`
		} `json:"last_error"`
		Memory *struct {
			Stale  bool      `json:"stale"`
			ReadAt time.Time `json:"read_at"`
		} `json:"memory"`
	} `json:"stores"`
	Bans []struct {
		Zone string `json:"zone"`
	} `json:"bans"`
}

// timedGet fetches an admin path, and how long it took.
func (n *node) timedGet(path string) (adminStale, time.Duration) {
	n.t.Helper()
	start := time.Now()
	resp, err := http.Get("http://" + n.Admin + path)
	if err != nil {
		n.t.Fatalf("GET %s: %v", path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != 200 {
		n.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	var a adminStale
	if err := json.Unmarshal(body, &a); err != nil {
		n.t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
	return a, took
}

// quantiles returns the p50 and p99 of ds (nearest rank).
func quantiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return at(.5), at(.99)
}

// TestAdminAPINeverWaitsOnStalledRedis: with Redis SIGSTOPped and no
// traffic, the stats tell within seconds that the store is not ok (the
// idle probe), and /rate_limit/stats, /rate_limit/bans and
// /rate_limit/denials answer within the store's timeout and a margin, with
// the last values read, marked stale with the time they were read.
func TestAdminAPINeverWaitsOnStalledRedis(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	site := fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout %s
		}
		zone api {
			key {header.X-Key}
			rate 1 1m
			burst 2
			ban 1h after 3 in 1m
		}
	}
	respond "ok"`, r.Addr, timeout)
	n := startCaddy(t, "", site)

	// A ban, and the fleet view of the zone, read once while Redis answers.
	for range 10 {
		n.get("/", "X-Key: mallory")
	}
	waitFreshFleetViewAndBan(t, n)

	r.Pause()
	paused := time.Now()
	defer r.Resume()

	waitIdleProbeFindsStall(t, n, paused)

	// Every endpoint answers in time, from what it read before (once the
	// last fresh read of the fleet view, reused for 900 ms, has aged).
	time.Sleep(time.Second)
	for _, path := range []string{"/rate_limit/stats", "/rate_limit/bans", "/rate_limit/denials"} {
		checkStaleAnswerInTime(t, n, path, timeout, paused)
	}
}

// waitFreshFleetViewAndBan waits up to 20 s for the admin API to show the
// zone's fleet view of one node and the one ban, both fresh.
func waitFreshFleetViewAndBan(t *testing.T, n *node) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, _ := n.timedGet("/rate_limit/stats")
		b, _ := n.timedGet("/rate_limit/bans")
		n.timedGet("/rate_limit/denials")
		if len(s.Zones) == 1 && s.Zones[0].Fleet != nil && len(s.Zones[0].Fleet.Nodes) == 1 && !s.Zones[0].Fleet.Stale &&
			len(b.Bans) == 1 && len(b.Stores) == 1 && !b.Stores[0].Stale {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fresh fleet view and ban 20 s on: stats %+v, bans %+v", s, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitIdleProbeFindsStall: with no traffic, the idle probe finds the
// stall, and the stats say so within about 3 s of the SIGSTOP.
func waitIdleProbeFindsStall(t *testing.T, n *node, paused time.Time) {
	t.Helper()
	for {
		s, _ := n.timedGet("/rate_limit/stats")
		if st := s.Stores[0]; st.Status != "ok" {
			t.Logf("stats said %s (breaker %s, last error %+v) %s after SIGSTOP, with no traffic",
				st.Status, st.Breaker, st.LastError, time.Since(paused).Round(time.Millisecond))
			break
		}
		if time.Since(paused) > 10*time.Second {
			t.Errorf("store still ok 10 s after SIGSTOP with no traffic: %+v", s.Stores)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if took := time.Since(paused); took > 6*time.Second && took < 10*time.Second {
		t.Errorf("the stall showed in the stats %s after SIGSTOP, want about 3 s at most", took)
	}
}

// checkStaleAnswerInTime calls path 20 times under the stalled Redis: its
// p99 is within the store's timeout and a margin, and the last answer
// holds what was read before the stall, marked stale with its time.
func checkStaleAnswerInTime(t *testing.T, n *node, path string, timeout time.Duration, paused time.Time) {
	t.Helper()
	const calls = 20
	bound := timeout + 500*time.Millisecond // the 50 ms margin, and room for this busy machine
	var took []time.Duration
	var last adminStale
	for range calls {
		a, d := n.timedGet(path)
		took = append(took, d)
		last = a
	}
	p50, p99 := quantiles(took)
	t.Logf("%s under a SIGSTOPped Redis (timeout %s): p50 %s, p99 %s over %d calls",
		path, timeout, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), calls)
	if p99 > bound {
		t.Errorf("%s: p99 %s under a SIGSTOPped Redis, want at most %s", path, p99, bound)
	}
	switch path {
	case "/rate_limit/stats":
		f := last.Zones[0].Fleet
		if f == nil || !f.Stale || f.ReadAt == nil || f.ReadAt.After(paused) || len(f.Nodes) != 1 {
			t.Errorf("stats' fleet view under a stalled Redis: %+v, want the last read, stale, read before the stall", f)
		}
		if m := last.Stores[0].Memory; m != nil && (!m.Stale || m.ReadAt.IsZero()) {
			t.Errorf("stats' Redis memory under a stalled Redis: %+v, want stale with its time", m)
		}
	case "/rate_limit/bans":
		src := last.Stores[0]
		if !src.Stale || src.ReadAt == nil || src.ReadAt.After(paused) || len(last.Bans) != 1 {
			t.Errorf("bans under a stalled Redis: %+v, %d bans, want the last read's ban, stale, read before the stall", src, len(last.Bans))
		}
	case "/rate_limit/denials":
		src := last.Stores[0]
		if src.Source != "fleet" || !src.Stale || src.ReadAt == nil || src.ReadAt.After(paused) {
			t.Errorf("denials under a stalled Redis: %+v, want the fleet's last read, stale, read before the stall", src)
		}
	}
}
