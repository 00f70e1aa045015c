package limiter

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestStallClockSince: the time a process ran is the time elapsed less the
// stall counted meanwhile; overlapping stalls count once, so the stall never
// exceeds the time elapsed.
func TestStallClockSince(t *testing.T) {
	t.Parallel()
	c := newStallClock()
	t.Cleanup(c.close)
	m := c.mark()
	time.Sleep(20 * time.Millisecond)
	c.add(15 * time.Millisecond)
	elapsed, ran := c.since(m)
	if elapsed < 20*time.Millisecond {
		t.Fatalf("elapsed %s after sleeping 20ms", elapsed)
	}
	if ran > elapsed-15*time.Millisecond {
		t.Fatalf("ran %s of %s with 15ms of stall counted", ran, elapsed)
	}
	c.add(15 * time.Millisecond) // the same 15 ms again
	c.add(time.Hour)             // and all the time before
	_, ran2 := c.since(m)
	if ran2 > ran+time.Millisecond {
		t.Fatalf("ran %s, then %s after more stall", ran, ran2)
	}
	elapsed3, ran3 := c.since(c.mark())
	if ran3 > elapsed3 {
		t.Fatalf("ran %s of %s", ran3, elapsed3)
	}
}

// starve plays a node that never runs, as a saturated CPU makes it seem:
// until the returned function is called, the store's stall clock counts all
// the time that passes as stall.
func starve(rs *RedisStore) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				rs.stall.add(time.Second)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// TestRedisStarvedNodeWaitsForReply pauses Redis for three timeouts while
// the node counts itself starved (stall added to its clock as a saturated
// CPU would): the decisions wait for Redis' replies instead of failing,
// and the circuit breaker counts nothing. With the same pause on a node
// that is not starved, they fail at the timeout (TestRedisTimeout).
func TestRedisStarvedNodeWaitsForReply(t *testing.T) {
	// Not parallel: it times a stall against the timeout.
	srv := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: timeout, BreakerFailures: 1})
	r := mustRule(t, "starved", 1000, time.Second, 0)
	decideOne(t, rs, r, "warm", 1)

	stopStarving := starve(rs)
	srv.Pause()
	go func() {
		time.Sleep(3 * timeout)
		srv.Resume()
	}()
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() {
			reqs := []Request{{Rule: r, Key: "k" + strconv.Itoa(i), Cost: 1}}
			_, errs[i] = rs.Decide(context.Background(), reqs, make([]Result, 1))
		})
	}
	wg.Wait()
	stopStarving()
	for i, err := range errs {
		if err != nil {
			t.Errorf("decision %d on a starved node failed: %v", i, err)
		}
	}
	if n := rs.Breaker().Opened(); n != 0 {
		t.Errorf("late replies on a starved node opened the breaker %d times", n)
	}
	if rs.Extended() == 0 {
		t.Error("no decision counted as extended")
	}
	t.Logf("%d decisions waited past the timeout", rs.Extended())
}

// TestRedisStarvedNodeHardCap: however starved the node, a decision gives
// up after at most twice MaxWait when Redis does not answer.
func TestRedisStarvedNodeHardCap(t *testing.T) {
	srv := redistest.Start(t)
	const timeout, maxWait = 20 * time.Millisecond, 300 * time.Millisecond
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: timeout, MaxWait: maxWait})
	r := mustRule(t, "capped", 1000, time.Second, 0)
	decideOne(t, rs, r, "warm", 1)
	srv.Pause()
	defer srv.Resume()
	defer starve(rs)()
	start := time.Now()
	_, err := rs.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
	took := time.Since(start)
	if !errors.Is(err, ErrStoreTimeout) {
		t.Fatalf("Redis paused: %v, want ErrStoreTimeout", err)
	}
	// A node that never runs gives up at twice MaxWait (it gets Timeout of
	// running time first). Generous: a busy machine wakes timers late.
	if took < maxWait || took > 2*maxWait+maxWait/2+200*time.Millisecond {
		t.Fatalf("gave up after %s, want at most about twice MaxWait (%s)", took, maxWait)
	}
	t.Logf("gave up after %s (MaxWait %s)", took, maxWait)
}

// TestRedisBreakerProbeAbandoned: the probe's client goes away before it
// is decided; Redis is healthy, and the breaker closes within a cooldown
// (it used to stay half-open for good).
func TestRedisBreakerProbeAbandoned(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const cooldown = 100 * time.Millisecond
	rs := newRedisStore(t, RedisOptions{Address: srv.Addr, BreakerFailures: 2, BreakerCooldown: cooldown})
	r := mustRule(t, "probe", 1000, time.Second, 0)
	decideOne(t, rs, r, "warm", 1)
	b := rs.Breaker()
	b.Failure()
	b.Failure()
	if b.State() != BreakerOpen {
		t.Fatalf("breaker %v after two failures, want open", b.State())
	}
	time.Sleep(cooldown + cooldown/5)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	reqs := []Request{{Rule: r, Key: "k", Cost: 1}}
	if _, err := rs.Decide(gone, reqs, make([]Result, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("probe with a gone client: %v, want context.Canceled", err)
	}
	// It closes at the next decision; the bound is generous for a busy
	// machine (a breaker stuck half-open never closes).
	start := time.Now()
	deadline := start.Add(cooldown + 2*time.Second)
	for b.State() != BreakerClosed {
		if time.Now().After(deadline) {
			t.Fatalf("breaker still %v %s after its probe's client went away", b.State(), time.Since(start))
		}
		_, _ = rs.Decide(context.Background(), reqs, make([]Result, 1))
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("closed %s after the probe's client went away (cooldown %s)", time.Since(start), cooldown)
}

// TestBreakerLostProbeExpires: a probe that never reports (neither success
// nor failure) stops blocking after a cooldown: the next caller probes.
func TestBreakerLostProbeExpires(t *testing.T) {
	t.Parallel()
	const cooldown = 50 * time.Millisecond
	b := NewBreaker(1, cooldown)
	b.Failure()
	time.Sleep(cooldown + 10*time.Millisecond)
	if !b.Allow() {
		t.Fatal("no probe after the cooldown")
	}
	if b.Allow() {
		t.Fatal("a second probe while the first is out")
	}
	time.Sleep(cooldown + 10*time.Millisecond)
	if !b.Allow() {
		t.Fatal("the lost probe still blocks a cooldown later")
	}
	b.Success()
	if b.State() != BreakerClosed {
		t.Fatalf("breaker %v after the new probe's success", b.State())
	}
}

// TestStallClockOff: a clock that is switched off counts no stall, so the
// time a process ran is the time elapsed, and it starts nothing to stop.
func TestStallClockOff(t *testing.T) {
	t.Parallel()
	c := stallClockOf(true)
	m := c.mark()
	time.Sleep(5 * time.Millisecond)
	c.add(time.Hour)
	elapsed, ran := c.since(m)
	if elapsed < 5*time.Millisecond || ran != elapsed {
		t.Fatalf("ran %s of %s on a clock that is off, with an hour of stall added", ran, elapsed)
	}
	c.close()
}

// TestRedisStallClockSettings pauses Redis for far longer than the
// timeout while the node counts itself starved, with the stall clock on
// and off (RedisOptions.DisableStallClock): on, the decision waits for
// Redis' reply and gets it once Redis resumes; off, the timeout counts
// wall time and the decision gives up while Redis is still paused.
func TestRedisStallClockSettings(t *testing.T) {
	// Not parallel: it times a stall against the timeout.
	const timeout = 50 * time.Millisecond
	const pause = 2 * time.Second // only a decision that waits sees Redis back
	for _, off := range []bool{false, true} {
		t.Run("disable_stall_clock="+strconv.FormatBool(off), func(t *testing.T) {
			srv := redistest.Start(t)
			rs := newRedisStore(t, RedisOptions{Address: srv.Addr, Timeout: timeout, MaxWait: 5 * time.Second,
				BreakerFailures: 1000, DisableStallClock: off})
			r := mustRule(t, "stall", 1000, time.Second, 0)
			decideOne(t, rs, r, "warm", 1)

			defer starve(rs)()
			srv.Pause()
			defer srv.Resume()
			done := make(chan error, 1)
			go func() {
				_, err := rs.Decide(context.Background(), []Request{{Rule: r, Key: "k", Cost: 1}}, make([]Result, 1))
				done <- err
			}()
			var err error
			select {
			case err = <-done: // gave up while Redis was paused
			case <-time.After(pause):
				srv.Resume()
				err = <-done
			}
			switch {
			case !off && err != nil:
				t.Fatalf("stall clock on: a starved node's decision failed: %v", err)
			case off && !errors.Is(err, ErrStoreTimeout):
				t.Fatalf("stall clock off: %v, want ErrStoreTimeout while Redis was paused", err)
			}
		})
	}
}
