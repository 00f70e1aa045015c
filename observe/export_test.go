package observe

import (
	"context"
	"time"
)

// What the tests of package observe_test read of the
// package's internals. They drive the rate_limit handler, whose package
// imports this one, so they cannot be in package observe.

// Gathered by the handler tests.
var (
	CollectStats = func(ctx context.Context, now time.Time, series int) *statsBody {
		return collectStats(ctx, now, series, nil) // every zone, as the admin API
	}
	Gather   = gather
	AdminGet = adminGet
)

// The stats document, as the handler tests read it.
type (
	StatsBody = statsBody
	StatsZone = statsZone
)

// ZoneReferences counts the references to the stats of a zone name, on
// every store.
func ZoneReferences(name string) int {
	var n int
	zoneRegistry.Range(func(k, _ any) bool {
		if key := k.(zoneKey); key.name == name {
			refs, _ := zoneRegistry.References(key)
			n += refs
		}
		return true
	})
	return n
}

// SeriesSeconds is how many seconds of per-second counts a zone keeps.
const SeriesSeconds = seriesSeconds
