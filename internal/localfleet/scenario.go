package localfleet

import (
	"fmt"
	"time"
)

// Scenario is a shared site configuration and the load to drive it with.
type Scenario struct {
	// Site is the site block, for every node.
	Site string
	// Targets are the requests of the load.
	Targets []*Target
	// Buckets are the buckets the targets draw from.
	Buckets []*Bucket
}

// deniedBody makes a 429's body the name of the zone that denied, so the
// load can count denials per zone.
const deniedBody = `
	handle_errors 429 {
		respond "{http.rate_limit.exceeded.name}" 429
	}`

// Exactness is the fleet exactness scenario: several zones with different
// rules, costs above 1, and a per-key zone composed with a global one, all
// saturated by the load. redisBlock is the `redis { ... }` block.
func Exactness(redisBlock string) *Scenario {
	site := fmt.Sprintf(`
	rate_limit {
		%s
		zone a {
			key {header.X-Key}
			rate 40 1s
			burst 20
			match {
				path /a
			}
		}
		zone b {
			key {header.X-Key}
			rate 15 1s
			burst 30
			cost {header.X-Cost}
			match {
				path /b
			}
		}
		zone c {
			key {header.X-Key}
			rate 600 1m
			burst 10
			match {
				path /c
			}
		}
		zone g_user {
			key {header.X-Key}
			rate 50 1s
			burst 25
			match {
				path /g
			}
		}
		zone g_all {
			key all
			rate 60 1s
			burst 30
			match {
				path /g
			}
		}
	}
	respond "ok"%s`, redisBlock, deniedBody)

	s := &Scenario{Site: site}
	bucket := func(zone, key string, rate int64, per time.Duration, burst int64, saturated bool) *Bucket {
		b := &Bucket{Zone: zone, Key: key, Rate: rate, Per: per, Burst: burst, Saturated: saturated}
		s.Buckets = append(s.Buckets, b)
		return b
	}
	target := func(name, path, key string, cost int64, buckets ...*Bucket) {
		h := []string{"X-Key: " + key}
		if cost != 1 {
			h = append(h, fmt.Sprintf("X-Cost: %d", cost))
		}
		s.Targets = append(s.Targets, &Target{Name: name, Path: path, Headers: h, Cost: cost, Buckets: buckets})
	}
	target("a1", "/a", "a1", 1, bucket("a", "a1", 40, time.Second, 20, true))
	target("a2", "/a", "a2", 1, bucket("a", "a2", 40, time.Second, 20, true))
	target("b1", "/b", "b1", 3, bucket("b", "b1", 15, time.Second, 30, true))
	target("b2", "/b", "b2", 2, bucket("b", "b2", 15, time.Second, 30, true))
	target("c1", "/c", "c1", 1, bucket("c", "c1", 600, time.Minute, 10, true))
	global := &Bucket{Zone: "g_all", Key: "all", Rate: 60, Per: time.Second, Burst: 30, Saturated: true}
	for i := 1; i <= 4; i++ {
		k := fmt.Sprintf("g%d", i)
		// Each user's own zone has room to spare: the global zone is what
		// binds, and its denials must not drain the users' buckets.
		target(k, "/g", k, 1, bucket("g_user", k, 50, time.Second, 25, false), global)
	}
	s.Buckets = append(s.Buckets, global)
	return s
}

// Flood is one key hammered far beyond its limit, for the deny cache.
func Flood(redisBlock string) *Scenario {
	site := fmt.Sprintf(`
	rate_limit {
		%s
		zone flood {
			key {header.X-Key}
			rate 2 1s
			burst 2
		}
	}
	respond "ok"%s`, redisBlock, deniedBody)
	b := &Bucket{Zone: "flood", Key: "victim", Rate: 2, Per: time.Second, Burst: 2}
	return &Scenario{
		Site:    site,
		Buckets: []*Bucket{b},
		Targets: []*Target{{Name: "victim", Path: "/", Headers: []string{"X-Key: victim"}, Cost: 1, Buckets: []*Bucket{b}}},
	}
}
