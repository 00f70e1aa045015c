package localfleet

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// zoneStats is what this package reads of a zone on a node's stats
// endpoint (/rate_limit/stats on the admin endpoint).
type zoneStats struct {
	Name     string                 `json:"name"`
	Prefetch *limiter.PrefetchStats `json:"prefetch"`
	Fleet    *struct {
		Nodes []string `json:"nodes"`
	} `json:"fleet"`
}

// zones reads the zones of the node's stats endpoint.
func (n *Node) zones() ([]zoneStats, error) {
	resp, err := client.Get("http://" + n.Admin + "/rate_limit/stats")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Zones []zoneStats `json:"zones"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET %s/rate_limit/stats: %w", n.Admin, err)
	}
	return body.Zones, nil
}

// ZonePrefetch returns what each node's prefetch did for the zone so far
// (the stats endpoint's prefetch), indexed like nodes; a node that shows
// none for it has zero counts.
func ZonePrefetch(nodes []*Node, zone string) ([]limiter.PrefetchStats, error) {
	out := make([]limiter.PrefetchStats, len(nodes))
	for i, nd := range nodes {
		zs, err := nd.zones()
		if err != nil {
			return nil, err
		}
		for _, z := range zs {
			if z.Name == zone && z.Prefetch != nil {
				out[i] = *z.Prefetch
			}
		}
	}
	return out, nil
}

// WaitFleetView waits until every node's stats show n nodes in the first
// zone's fleet view, then for the reports that follow (once a second) to
// count them: the nodes' pacing divides a key's refill among the nodes it
// counts. A node joins the view once it decided a request. It gives up
// after timeout.
func WaitFleetView(nodes []*Node, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, nd := range nodes {
		for {
			zs, err := nd.zones()
			var seen []string
			if err == nil && len(zs) > 0 && zs[0].Fleet != nil {
				seen = zs[0].Fleet.Nodes
				if len(seen) == n {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the fleet view of %s did not show %d nodes within %s: %v %v", nd.URL, n, timeout, seen, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	time.Sleep(2500 * time.Millisecond)
	return nil
}
