//go:build fleetlimit_clockskew

package limiter

import (
	"fmt"
	"os"
	"time"
)

// In a build with the fleetlimit_clockskew tag, FLEETLIMIT_CLOCK_SKEW (a
// duration such as "1h" or "-45m") shifts this node's clock, so that the
// fleet tests can run a node whose clock is wrong and show that the shared
// buckets do not notice. Production builds have no such hook.
func init() {
	skew, err := time.ParseDuration(os.Getenv("FLEETLIMIT_CLOCK_SKEW"))
	if err != nil || skew == 0 {
		return
	}
	nodeClock = func() time.Time { return time.Now().Add(skew) }
	fmt.Fprintf(os.Stderr, "fleetlimit: test build: this node's clock is shifted by %s\n", skew)
}
