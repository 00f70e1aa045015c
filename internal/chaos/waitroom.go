package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// checkWaitRooms checks that no leaky bucket zone's waiting room holds a
// place once the load has ended and settled: every request that waited for
// its turn, was canceled, hit a fault or outlived a reload left it.
func (c *checker) checkWaitRooms(nodes []*localfleet.Node) {
	cl := &http.Client{Timeout: 5 * time.Second}
	for i, n := range nodes {
		waiting, err := waitingPlaces(cl, n.Admin)
		if err != nil {
			c.fail(InvWaiting, "node %d: reading its stats: %v", i, err)
			continue
		}
		for zone, w := range waiting {
			if w != 0 {
				c.fail(InvWaiting, "node %d: zone %s's waiting room holds %d places %s after the load ended", i, zone, w, settle)
			}
		}
	}
}

// waitingPlaces returns, per leaky bucket zone of the node whose admin
// API is at admin, how many places its waiting room holds.
func waitingPlaces(cl *http.Client, admin string) (map[string]int64, error) {
	resp, err := cl.Get("http://" + admin + "/rate_limit/stats")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/rate_limit/stats answered %s", resp.Status)
	}
	var doc struct {
		Zones []struct {
			Name  string `json:"name"`
			Queue *struct {
				Waiting int64 `json:"waiting"`
			} `json:"queue"`
		} `json:"zones"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, z := range doc.Zones {
		if z.Queue != nil {
			out[z.Name] += z.Queue.Waiting
		}
	}
	return out, nil
}
