package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// memoryStoreStats reads the memory store's keys and bound off a node's
// GET /rate_limit/stats.
func memoryStoreStats(t *testing.T, admin string) (keys, maxKeys int) {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/rate_limit/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Stores []struct {
			Name    string `json:"name"`
			Keys    int    `json:"keys"`
			MaxKeys int    `json:"max_keys"`
		} `json:"stores"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("stats: %v", err)
	}
	for _, s := range body.Stores {
		if s.Name == "memory" {
			return s.Keys, s.MaxKeys
		}
	}
	t.Fatalf("stats: no memory store in %+v", body.Stores)
	return 0, 0
}

// TestMaxKeysOfTwoSites: one Caddyfile, two sites sharing the process's
// memory store: one on it with max_keys 2000, one on Redis whose zone
// falls back to local buckets (on_error local, the default) and writes no
// max_keys. Caddy provisions the sites in no fixed order, so the test loads
// the same configuration several times (each load provisions them again):
// after each the store's bound is the written 2000, as the stats show it,
// and a flood of 3000 new keys on the bounded site leaves at most 2000
// buckets (and the per-shard rounding: 2048).
func TestMaxKeysOfTwoSites(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	admin := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	bounded, idle := redistest.FreePort(t), redistest.FreePort(t)
	cfg := fmt.Sprintf(`{
	admin %s
	persist_config off
	auto_https off
}

http://127.0.0.1:%d {
	rate_limit {
		max_keys 2000
		zone bounded {
			key {header.X-Key}
			rate 100 24h
		}
	}
	respond "ok"
}

http://127.0.0.1:%d {
	rate_limit {
		redis {
			address %s
		}
		zone idle {
			key {header.X-Key}
			rate 10 1s
		}
	}
	respond "ok"
}
`, admin, bounded, idle, r.Addr)
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	n := localfleet.StartFile(t, caddyBin, file, admin, bounded)
	for load := range 6 {
		if load > 0 {
			// The same configuration again, provisioned anew.
			req, _ := http.NewRequest(http.MethodPost, "http://"+admin+"/load", strings.NewReader(cfg))
			req.Header.Set("Content-Type", "text/caddyfile")
			req.Header.Set("Cache-Control", "must-revalidate")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("load %d: %d %s", load, resp.StatusCode, body)
			}
		}
		if _, got := memoryStoreStats(t, admin); got != 2000 {
			t.Fatalf("load %d: the memory store's bound is %d, want the max_keys 2000 the bounded site writes\ncaddy output:\n%s", load, got, n.Log.String())
		}
	}
	for i := range 3000 {
		resp, err := n.Do(http.MethodGet, "/", "X-Key: flood-"+strconv.Itoa(i))
		if err != nil || resp.Status != 200 {
			t.Fatalf("flood request %d: %v %+v", i, err, resp)
		}
	}
	if keys, _ := memoryStoreStats(t, admin); keys < 1900 || keys > 2048 {
		t.Errorf("after 3000 new keys the memory store holds %d buckets, want about its bound of 2000 (at most 2048)", keys)
	}
}
