package observe

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The fleet view: every node adds its per-zone counts to per-second totals
// in the Redis its zones share, so the dashboard of any
// node shows what the whole fleet decided. One goroutine
// per Redis store (not per handler) reports once a second, through the
// store's own client, never on the request path; it lives as long as the
// store's stats (storeRegistry), which outlive reloads.

const (
	// fleetInterval is how often a node reports its counts.
	fleetInterval = time.Second
	// fleetTimeout bounds one report or one read.
	fleetTimeout = 800 * time.Millisecond
	// fleetReadCache is how long a read of the fleet's counts is reused,
	// so that several open dashboards cost Redis one read a second.
	fleetReadCache = 900 * time.Millisecond
	// fleetWarnEvery is how often a failing report is logged at most.
	fleetWarnEvery = time.Minute
)

// nodeID names this node in the fleet: its host name and process id.
var nodeID = func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "node"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}()

// fleetReporter reports a Redis store's zones to the fleet counters and
// reads them back for the admin API.
type fleetReporter struct {
	s    *storeStats
	log  *zap.Logger
	quit chan struct{}
	done chan struct{}

	mu       sync.Mutex
	reported map[*zoneStats][limiter.NumOutcomes]uint64 // totals already reported
	lastWarn time.Time

	lastOK  atomic.Int64 // unix nanoseconds of the last successful report
	lastErr atomic.Pointer[storeError]
	// nodes is how many nodes the last successful report found in the
	// fleet within FleetNodeTimeout (0: none yet).
	nodes atomic.Int64

	// last is the last reads of the fleet's counts (see fleetReadCache).
	last cachedRead[*FleetView]
}

func startFleetReporter(s *storeStats) *fleetReporter {
	f := &fleetReporter{
		s:        s,
		log:      caddy.Log().Named("http.handlers.rate_limit.fleet"),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		reported: make(map[*zoneStats][limiter.NumOutcomes]uint64),
	}
	go f.run()
	return f
}

func (f *fleetReporter) run() {
	defer close(f.done)
	t := time.NewTicker(fleetInterval)
	defer t.Stop()
	for {
		select {
		case <-f.quit:
			return
		case <-t.C:
			f.report()
		}
	}
}

// stop ends the reporter and waits for it.
func (f *fleetReporter) stop() {
	close(f.quit)
	<-f.done
}

// link starts reporting a zone, from its counts now.
func (f *fleetReporter) link(z *zoneStats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.reported[z]; !ok {
		f.reported[z] = z.loadTotals()
	}
}

// report sends what each zone decided since the last successful report.
// When it fails, the counts wait for the next one.
func (f *fleetReporter) report() {
	var (
		reports []FleetReport
		zones   []*zoneStats
		totals  [][limiter.NumOutcomes]uint64
	)
	f.mu.Lock()
	for z, last := range f.reported {
		if z.dead.Load() {
			delete(f.reported, z)
			continue
		}
		now := z.loadTotals()
		r := FleetReport{Zone: z.name}
		for o := range now {
			r.Counts[o] = int64(now[o] - last[o])
		}
		reports, zones, totals = append(reports, r), append(zones, z), append(totals, now)
	}
	f.mu.Unlock()
	if len(reports) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
	nodes, err := f.s.shared.fleetReport(ctx, nodeID, reports)
	cancel()
	if err != nil {
		f.lastErr.Store(&storeError{msg: err.Error(), at: time.Now()})
		f.mu.Lock()
		warn := time.Since(f.lastWarn) >= fleetWarnEvery
		if warn {
			f.lastWarn = time.Now()
		}
		f.mu.Unlock()
		if warn {
			f.log.Warn("reporting rate limit counts to the fleet view failed (limiting is not affected)",
				zap.String("store", f.s.name), zap.Error(err))
		}
		return
	}
	f.lastOK.Store(time.Now().UnixNano())
	f.nodes.Store(int64(nodes))
	f.mu.Lock()
	for i, z := range zones {
		if _, ok := f.reported[z]; ok {
			f.reported[z] = totals[i]
		}
	}
	f.mu.Unlock()
}

// read returns the fleet's counts of the zones over the last seconds: a
// read younger than fleetReadCache, else what Redis answers by deadline,
// else the last read, stale.
func (f *fleetReporter) read(zones []string, seconds int, deadline time.Time) reading[*FleetView] {
	key := strings.Join(zones, "\x00") + "\x00" + strconv.Itoa(seconds)
	return f.last.get(f.s.ctx, key, fleetReadCache, deadline, fleetTimeout, func(ctx context.Context) (*FleetView, error) {
		return f.s.shared.fleetRead(ctx, zones, seconds)
	})
}
