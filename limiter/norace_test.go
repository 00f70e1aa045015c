//go:build !race

package limiter

// raceEnabled reports whether the tests run under the race detector: false
// in a build without it.
const raceEnabled = false
