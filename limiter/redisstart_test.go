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

// startPause is how long the start-up tests keep Redis paused after the
// store is made: far longer than the default timeout (25ms), far shorter
// than startMaxWait.
const startPause = 300 * time.Millisecond

// startMaxWait is the start-up tests' max_wait: long enough for a process
// that the machine's load starves (it may run a tenth of the time) to read
// Redis' replies once Redis resumes.
const startMaxWait = 5 * time.Second

// resumeAfter resumes the paused servers after d, and waits for that when
// the test ends.
func resumeAfter(t *testing.T, d time.Duration, servers ...*redistest.Server) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(d)
		for _, srv := range servers {
			srv.Resume()
		}
	}()
	t.Cleanup(func() { <-done })
}

// TestRedisStartDecidesByRedis: a store made while its Redis answers late
// (paused for startPause, so that its first connection and script load take
// that long: a node started on a loaded machine) decides the requests that
// arrive meanwhile by Redis. They wait for the start-up connection up to
// max_wait, not only the timeout, which would hand them to the failure
// policy (the invariant checker's seeds 320035 and 320051: a restarted
// node answered its first requests by on_error deny or allow). One request
// of a zone on one server; one whose zones live on two Cluster slots.
func TestRedisStartDecidesByRedis(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		srv.Pause()
		resumeAfter(t, startPause, srv)
		s := newStartingStore(t, RedisOptions{Address: srv.Addr, MaxWait: startMaxWait})
		r := mustRule(t, "api", 100, time.Minute, 0)
		decideWhileStarting(t, s, func(i int) []Request {
			return []Request{{Rule: r, Key: "client" + strconv.Itoa(i), Cost: 1}}
		})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		nodes := c.Nodes()
		for _, n := range nodes {
			n.Pause()
		}
		resumeAfter(t, startPause, nodes...)
		s := newStartingStore(t, RedisOptions{Addresses: c.Addrs(), MaxWait: startMaxWait})
		a := mustRule(t, "a", 100, time.Minute, 0)
		b := mustRule(t, "b", 100, time.Minute, 0)
		decideWhileStarting(t, s, func(i int) []Request {
			k := "client" + strconv.Itoa(i)
			if i%2 == 0 {
				return []Request{{Rule: a, Key: k, Cost: 1}}
			}
			other := "other" + k
			if keySlot(s.Key("b", other)) == keySlot(s.Key("a", k)) {
				t.Errorf("keys %q and %q share a slot: the request would take one round trip", k, other)
			}
			return []Request{{Rule: a, Key: k, Cost: 1}, {Rule: b, Key: other, Cost: 1}}
		})
	})
}

// newStartingStore makes a store, closed when the test ends, and does not
// wait for its start-up.
func newStartingStore(t *testing.T, opt RedisOptions) *RedisStore {
	t.Helper()
	s, err := NewRedisStore(opt)
	if err != nil {
		t.Fatalf("NewRedisStore: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// decideWhileStarting sends ten decisions at once, right after the store
// was made, and fails the test if any was not decided by Redis.
func decideWhileStarting(t *testing.T, s *RedisStore, reqs func(i int) []Request) {
	t.Helper()
	began := time.Now()
	errs := make([]error, 10)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			rs := reqs(i)
			res := make([]Result, len(rs))
			ok, err := s.Decide(context.Background(), rs, res)
			if err == nil && !ok {
				err = errors.New("denied")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("decision %d, sent as the store started (Redis answering after %s): %v after %s; want it admitted by Redis",
				i, startPause, err, time.Since(began).Round(time.Millisecond))
		}
	}
}

// TestRedisStartHungRedis: a Redis that does not answer at start-up (paused
// throughout) delays neither the store nor its decisions past their
// bounds: the start-up connection attempt ends after about DialTimeout +
// Timeout and reports its failure; a decision sent meanwhile takes the
// failure policy within twice MaxWait; one sent after it, at Timeout. (The
// margins are for a loaded machine, whose timers run late.)
func TestRedisStartHungRedis(t *testing.T) {
	// Not parallel: it times decisions against their bounds.
	srv := redistest.Start(t)
	srv.Pause()
	defer srv.Resume()
	// The stall clock off: the bounds are in wall time.
	opt := RedisOptions{Address: srv.Addr, Timeout: 50 * time.Millisecond, MaxWait: time.Second,
		DialTimeout: 200 * time.Millisecond, DisableStallClock: true}
	began := time.Now()
	s := newStartingStore(t, opt)
	warmed := make(chan error, 1)
	var warmTook time.Duration
	go func() {
		err := s.WaitWarm(context.Background())
		warmTook = time.Since(began)
		warmed <- err
	}()
	r := mustRule(t, "api", 100, time.Minute, 0)
	res := make([]Result, 1)
	_, err := s.Decide(context.Background(), []Request{{Rule: r, Key: "early", Cost: 1}}, res)
	if took := time.Since(began); !errors.Is(err, ErrStoreTimeout) || took > 2*opt.MaxWait+time.Second {
		t.Fatalf("a decision sent as the store started on a hung Redis: %v after %s; want %v within 2 x %s",
			err, took, ErrStoreTimeout, opt.MaxWait)
	}
	select {
	case err = <-warmed:
	case <-time.After(10 * time.Second):
		t.Fatal("the start-up connection attempt on a hung Redis did not end within 10s")
	}
	if bound := opt.DialTimeout + opt.Timeout; err == nil || warmTook > bound+2*time.Second {
		t.Fatalf("WaitWarm on a hung Redis: %v after %s; want the start-up's failure after about %s", err, warmTook, bound)
	}
	began = time.Now()
	_, err = s.Decide(context.Background(), []Request{{Rule: r, Key: "later", Cost: 1}}, res)
	if took := time.Since(began); !errors.Is(err, ErrStoreTimeout) || took >= opt.MaxWait {
		t.Fatalf("a decision sent after the start-up gave up: %v after %s; want %v at the timeout %s, before max_wait %s",
			err, took, ErrStoreTimeout, opt.Timeout, opt.MaxWait)
	}
}
