package tests

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestClockDrift: a node whose clock is 250ms ahead (a test build hook
// shifts the node's time source) reports its offset against Redis' TIME as
// -250ms, within 10ms, in the metric and in the stats; a node on the system
// clock reports about zero (redis-server runs on this machine's clock).
// Limiting does not notice: both still share one bucket.
func TestClockDrift(t *testing.T) {
	t.Parallel()
	skewedBin := skewedCaddy(t)
	r := redistest.Start(t)
	site := fmt.Sprintf(`
	rate_limit {
		redis {
			address %s
			timeout 2s
		}
		zone drift {
			key {header.X-Key}
			rate 2 1h
		}
	}
	respond "ok"`, r.Addr)
	sn := localfleet.StartNode(t, skewedBin, "", site, "FLEETLIMIT_CLOCK_SKEW=250ms")
	skewed := &node{Node: sn, t: t, log: sn.Log}
	exact := startCaddy(t, "", site)
	if !strings.Contains(skewed.log.String(), "shifted by 250ms") {
		t.Fatalf("the node does not run with its clock skewed; its output:\n%s", skewed.log.String())
	}
	store := "redis:" + r.Addr
	for _, c := range []struct {
		name string
		n    *node
		want float64 // seconds
	}{{"skewed", skewed, -0.250}, {"exact", exact, 0}} {
		// The estimate is the reading of shortest round trip among the
		// last few, one a second: wait until it is close, as it soon is
		// unless the machine is very busy.
		const tolerance = 0.010
		var got float64
		deadline := time.Now().Add(30 * time.Second)
		for {
			v, ok := metric(c.n.scrape(), "caddy_rate_limit_clock_offset_seconds", "store", store)
			got = v
			if ok && math.Abs(v-c.want) <= tolerance {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s node: caddy_rate_limit_clock_offset_seconds = %v (present %v), want %v ± %v", c.name, v, ok, c.want, tolerance)
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("%s node: clock offset %.2f ms", c.name, got*1000)
		// The stats say the same, in milliseconds.
		var s struct {
			Stores []struct {
				Name  string `json:"name"`
				Clock *struct {
					OffsetMS    float64   `json:"offset_ms"`
					RoundTripMS float64   `json:"round_trip_ms"`
					Time        time.Time `json:"time"`
				} `json:"clock"`
			} `json:"stores"`
		}
		if err := json.Unmarshal([]byte(c.n.adminGet("/rate_limit/stats?series=0")), &s); err != nil {
			t.Fatal(err)
		}
		if len(s.Stores) != 1 || s.Stores[0].Clock == nil {
			t.Fatalf("%s node: stores %+v, want one with its clock", c.name, s.Stores)
		}
		if ck := s.Stores[0].Clock; math.Abs(ck.OffsetMS-c.want*1000) > tolerance*1000 || ck.RoundTripMS < 0 {
			t.Errorf("%s node: stats clock %+v, want offset_ms %v ± %v", c.name, *ck, c.want*1000, tolerance*1000)
		}
	}
	// Buckets never depend on it: the two nodes share one.
	if got := skewed.statuses(2, "/", "X-Key: k"); got[200] != 2 {
		t.Fatalf("skewed node: %v", got)
	}
	if got := exact.statuses(1, "/", "X-Key: k"); got[429] != 1 {
		t.Errorf("exact node after the skewed one took the bucket's two tokens: %v, want a denial", got)
	}
}
