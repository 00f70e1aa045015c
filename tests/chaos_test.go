package tests

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/chaos"
)

var (
	chaosFor  = flag.Duration("chaos.for", 0, "run the invariant checker on seeds from -chaos.seed upwards for this long instead of its fixed seeds")
	chaosSeed = flag.Uint64("chaos.seed", 1000, "the first seed of -chaos.for, or the only seed when -chaos.for is 0 and it is not the default")
)

// chaosSeeds are the seeds the checker runs by default: within about a
// minute, one Redis whose clients are killed, paused and made to sleep
// under three nodes, a memory store reloaded four times beside an exempt
// client, concurrency slots across a SIGSTOP and a DEBUG SLEEP, and
// cost_header zones (one with a quota) through a node's kill -9. Each also
// has a soft shed's small waiting room, filled by a hog beside a guest of
// one request at a time, and the last a client that hangs up mid-stream
// on a count_status zone that counts its status.
var chaosSeeds = []uint64{8, 9, 25, 89}

// chaosLoad is how long each default scenario's clients send.
const chaosLoad = 4 * time.Second

// TestChaos runs the invariant checker (internal/chaos) on a few seeded
// scenarios over real Caddy and redis-server processes, and fails with the
// seed and a reproduction for every invariant one breaks. With
// -chaos.for=30m it runs seeds until that time has passed.
func TestChaos(t *testing.T) {
	o := chaos.Options{Load: chaosLoad}
	seeds := chaosSeeds
	if *chaosSeed != 1000 {
		seeds = []uint64{*chaosSeed}
	}
	if *chaosFor > 0 {
		o.Load = 10 * time.Second
		deadline := time.Now().Add(*chaosFor)
		n := 0
		for s := *chaosSeed; time.Now().Before(deadline); s++ {
			runChaos(t, s, o)
			n++
		}
		t.Logf("%d scenarios run", n)
		return
	}
	for _, s := range seeds {
		runChaos(t, s, o)
	}
}

func runChaos(t *testing.T, seed uint64, o chaos.Options) {
	t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
		res := chaos.Run(t, caddyBin, chaos.Draw(seed, o))
		var b strings.Builder
		o.Explain = true // a violation in CI shows its trace
		res.Print(&b, o)
		t.Log(b.String())
		for _, v := range res.Violations {
			t.Errorf("seed %d: %s\n\trepro: %s", seed, v, chaos.Repro(seed, o))
		}
	})
}
