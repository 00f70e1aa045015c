//go:build !fleetlimit_clockskew

package limiter

// defaultClock is the clock of options that name none: the system clock.
// It is never reassigned (builds with the fleetlimit_clockskew tag define
// it with skewedClock instead).
var defaultClock Clock = SystemClock{}
