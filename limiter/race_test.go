//go:build race

package limiter

// raceEnabled reports whether the tests run under the race detector, which
// makes every memory access several times slower: a few loads are scaled
// down for it.
const raceEnabled = true
