package tests

import (
	"flag"
	"strconv"
	"testing"
)

// The parallel tests are of two kinds. Most wait: on a process to start,
// a bucket to refill, a window to pass. A few keep both CPUs busy for
// seconds (a fleet under load, a key flood) or assert timing that such
// load disturbs. go test's default, -parallel GOMAXPROCS, runs two at a
// time on a two-CPU machine, and the CPUs idle while two waiting tests
// sleep; so the package runs parallelTests at once, and the heavy ones
// among them take one of heavySlots first (parallelHeavy): at most two
// heavy tests run side by side, as under the default.
const (
	parallelTests = 4
	heavySlots    = 2
)

// heavy holds a token per heavy test running.
var heavy = make(chan struct{}, heavySlots)

// parallelHeavy is t.Parallel for a heavy test: it returns once one of
// heavySlots is free, and frees it when the test and its subtests end. A
// test calls it at one level only: a parent holding a slot while its
// subtests wait for one would never end.
func parallelHeavy(t *testing.T) {
	t.Helper()
	t.Parallel()
	heavy <- struct{}{}
	t.Cleanup(func() { <-heavy })
}

// setParallel sets -test.parallel to parallelTests unless the command
// line set it. It runs after flag.Parse.
func setParallel() {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(parallelTests))
	}
}
