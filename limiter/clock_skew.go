//go:build fleetlimit_clockskew

package limiter

import (
	"fmt"
	"os"
	"time"
)

// defaultClock is the clock of options that name none. In a build with the
// fleetlimit_clockskew tag, FLEETLIMIT_CLOCK_SKEW (a duration such as "1h"
// or "-45m") shifts it, so that the fleet tests can run a node whose clock
// is wrong and show that the shared buckets do not notice. Production
// builds have no such hook (their defaultClock is SystemClock). It is
// never reassigned.
var defaultClock = skewedClock()

// skewedClock returns the system clock shifted by FLEETLIMIT_CLOCK_SKEW, and
// says so on standard error; the system clock when it is unset or zero.
func skewedClock() Clock {
	skew, err := time.ParseDuration(os.Getenv("FLEETLIMIT_CLOCK_SKEW"))
	if err != nil || skew == 0 {
		return SystemClock{}
	}
	fmt.Fprintf(os.Stderr, "fleetlimit: test build: this node's clock is shifted by %s\n", skew)
	return ClockFunc(func() time.Time { return time.Now().Add(skew) })
}
