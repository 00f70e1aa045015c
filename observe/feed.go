package observe

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The denial feed: each store's stats keep the last feedRing denials of
// this node (denialFeed), and a Redis store's send a sample of them to the
// zones' streams (feedWriter), so that any node can list the fleet's. Its
// cost on the request path and what it shows of a client: docs/design.md.

const (
	// feedRing is how many denials each store's feed keeps on this node.
	feedRing = 200
	// feedPerMilli is how many denials of a millisecond a store's feed
	// records at most (4,000 a second): under a bigger flood the ring is a
	// sample of it, still its last fiftieth of a second at least, and a
	// denial past the bound costs an atomic add instead of the copy of
	// its request into a slot that is never in the CPU's cache.
	feedPerMilli = 4
	// feedSample is how many denials a second a store's feed sends to
	// Redis at most: the first of each second.
	feedSample = 50
	// feedQueue is how many sampled denials wait for the writer at most.
	feedQueue = 2 * feedSample
	// feedInterval is how often the writer sends the sampled denials.
	feedInterval = time.Second
	// feedTimeout bounds one send to Redis, or one read of the streams.
	feedTimeout = 800 * time.Millisecond
	// feedWarnEvery is how often a failing send is logged at most, and
	// how long the writer pauses when Redis refuses it the commands.
	feedWarnEvery = time.Minute
)

// The room of a denial's fields: client input longer than its room is cut
// short; a key has the room the others leave, feedKeyRoom at least, and is
// kept whole (in a copy of its own when longer).
const (
	feedMethodRoom = 16
	feedHostRoom   = 128
	feedPathRoom   = 256
	feedKeyRoom    = 128
)

// Fields of a denial that were cut short.
const (
	cutMethod = 1 << iota
	cutHost
	cutPath
)

// denial is one denied request as a feed records it: of fixed size, its
// text copied into buf, so that the request's memory is not kept and
// recording does not allocate.
type denial struct {
	at     time.Time
	zone   string           // the zone's name, from the configuration
	route  string           // what the zone's matchers match, from the configuration
	digest limiter.Digester // the handler's, for the key's digest
	// ip is the client's address: as it is with logKey, else already
	// masked to its network (network).
	ip             netip.Addr
	logKey         bool
	banned, dryRun bool
	cut            uint8
	// The method, host, path and key are buf[:method], buf[method:host],
	// buf[host:path] and buf[path:key]; a key longer than the room left
	// (feedKeyRoom at least) is long instead.
	method, host, path, key uint16
	long                    string
	buf                     [feedMethodRoom + feedHostRoom + feedPathRoom + feedKeyRoom]byte
}

// denialRequest is what Decided hands the feed of one zone's denial.
type denialRequest struct {
	at             time.Time
	zone           string
	key            string
	method         string
	host           string
	path           string // kept only with logKey
	route          string
	ip             netip.Addr
	logKey         bool
	digest         limiter.Digester
	banned, dryRun bool
}

// fill records req in d, masking the address and leaving the path out
// unless logKey: a path can carry a client's secret (a reset token), and
// the zone and its route tell what was denied without it.
func (d *denial) fill(req *denialRequest) {
	d.at, d.zone, d.route, d.digest = req.at, req.zone, req.route, req.digest
	d.logKey, d.banned, d.dryRun, d.cut = req.logKey, req.banned, req.dryRun, 0
	d.ip = req.ip
	if !req.logKey {
		d.ip = network(req.ip).Addr()
	}
	n := d.put(0, req.method, feedMethodRoom, cutMethod)
	d.method = uint16(n)
	n = d.put(n, req.host, feedHostRoom, cutHost)
	d.host = uint16(n)
	path := req.path
	if !req.logKey {
		path = ""
	}
	n = d.put(n, path, feedPathRoom, cutPath)
	d.path = uint16(n)
	d.long = ""
	if len(req.key) <= len(d.buf)-n {
		n += copy(d.buf[n:], req.key)
	} else {
		d.long = strings.Clone(req.key) // the key must be whole to digest it
	}
	d.key = uint16(n)
}

// put copies s, cut to room bytes, to buf at off, and returns where it
// ends.
func (d *denial) put(off int, s string, room int, cut uint8) int {
	if len(s) > room {
		s = s[:room]
		d.cut |= cut
	}
	return off + copy(d.buf[off:], s)
}

// field returns buf[from:to], with an ellipsis when cut short.
func (d *denial) field(from, to uint16, cut uint8) string {
	s := string(d.buf[from:to])
	if d.cut&cut != 0 {
		s += "…"
	}
	return s
}

// export returns the denial as the feed shows it: the key's digest (and
// the key with log_key), the address (its network without log_key), this
// node's id.
func (d *denial) export() Denial {
	key := d.rawKey()
	out := Denial{
		Time:      d.at,
		Zone:      d.zone,
		KeyDigest: d.digest.Digest(key),
		Method:    d.field(0, d.method, cutMethod),
		Host:      d.field(d.method, d.host, cutHost),
		Path:      d.field(d.host, d.path, cutPath),
		Route:     d.route,
		Node:      nodeID,
		Banned:    d.banned,
		DryRun:    d.dryRun,
	}
	switch {
	case !d.ip.IsValid():
	case d.logKey:
		out.ClientIP = d.ip.String()
	default:
		out.ClientIP = network(d.ip).String()
	}
	if d.logKey {
		out.Key = key
	}
	return out
}

// rawKey returns the denied request's client key, as its bucket names it.
func (d *denial) rawKey() string {
	if d.long != "" {
		return d.long
	}
	return string(d.buf[d.path:d.key])
}

// keysOf returns the client keys of the ring's denials in zone, each once:
// the keys whose digests this node can resolve.
func (f *denialFeed) keysOf(zone string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for i := uint64(0); i < min(f.next, feedRing); i++ {
		if d := &f.ring[i]; d.zone == zone {
			if k := d.rawKey(); !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

// denialFeed is one store's feed on this node: the ring of its last
// denials and, for a Redis store, the queue of the sampled ones.
type denialFeed struct {
	mu      sync.Mutex
	ring    [feedRing]denial
	next    uint64 // how many denials were recorded: ring[next%feedRing] is the next slot
	second  int64  // the unix second sampled counts
	sampled int    // denials sampled in second

	queue   chan denial // nil for the memory store
	dropped atomic.Uint64

	// milli is the unix millisecond inMilli counts the denials of (see
	// feedPerMilli); thinned counts those left out.
	milli, inMilli atomic.Int64
	thinned        atomic.Uint64
}

func newDenialFeed(sampled bool) *denialFeed {
	f := &denialFeed{}
	if sampled {
		f.queue = make(chan denial, feedQueue)
	}
	return f
}

// record keeps one denial, unless feedPerMilli of its millisecond were
// kept, and queues it for Redis when it is among the first feedSample of
// its second.
func (f *denialFeed) record(req *denialRequest) {
	if ms := req.at.UnixMilli(); f.milli.Load() != ms {
		// A new millisecond. Two denials may both see it new: the bound
		// is then passed by one, which does not matter.
		f.milli.Store(ms)
		f.inMilli.Store(1)
	} else if f.inMilli.Add(1) > feedPerMilli {
		f.thinned.Add(1)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d := &f.ring[f.next%feedRing]
	f.next++
	d.fill(req)
	if f.queue == nil {
		return
	}
	if sec := req.at.Unix(); sec != f.second {
		f.second, f.sampled = sec, 0
	}
	if f.sampled >= feedSample {
		return
	}
	f.sampled++
	select {
	case f.queue <- *d:
	default:
		f.dropped.Add(1)
	}
}

// recent returns up to limit of the ring's denials, newest first, of the
// zone named (of every zone if zone is "").
func (f *denialFeed) recent(zone string, limit int) []Denial {
	return f.pick(func(z string) bool { return zone == "" || z == zone }, limit)
}

// recentOf returns up to limit of the ring's denials, newest first, of the
// zones named.
func (f *denialFeed) recentOf(zones []string, limit int) []Denial {
	return f.pick(func(z string) bool { return slices.Contains(zones, z) }, limit)
}

// pick returns up to limit of the ring's denials, newest first, of the
// zones that in reports true for.
func (f *denialFeed) pick(in func(zone string) bool, limit int) []Denial {
	var picked []denial
	f.mu.Lock()
	for i := uint64(0); i < min(f.next, feedRing) && len(picked) < limit; i++ {
		d := &f.ring[(f.next-1-i)%feedRing]
		if in(d.zone) {
			picked = append(picked, *d)
		}
	}
	f.mu.Unlock()
	out := make([]Denial, len(picked))
	for i := range picked {
		out[i] = picked[i].export()
	}
	return out
}

// feedWriter sends a Redis store's sampled denials to the zones' streams,
// once a second, off the request path. It lives as long as the store's
// stats.
type feedWriter struct {
	feed  *denialFeed
	redis *redisStats
	store string
	log   *zap.Logger
	quit  chan struct{}
	done  chan struct{}

	lastErr atomic.Pointer[storeError]
}

func startFeedWriter(s *storeStats) *feedWriter {
	w := &feedWriter{
		feed:  s.feed,
		redis: s.shared,
		store: s.name,
		log:   caddy.Log().Named("http.handlers.rate_limit.feed"),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go w.run()
	return w
}

func (w *feedWriter) run() {
	defer close(w.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-w.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(feedInterval)
	defer t.Stop()
	batch := make([]Denial, 0, feedQueue)
	var lastWarn, pausedUntil time.Time
	refusalSaid := false
	for {
		select {
		case <-w.quit:
			return
		case <-t.C:
		}
		batch = w.drain(batch[:0])
		if len(batch) == 0 || time.Now().Before(pausedUntil) {
			continue
		}
		c, cancelSend := context.WithTimeout(ctx, feedTimeout)
		err := w.redis.appendDenials(c, batch)
		cancelSend()
		switch {
		case err == nil, ctx.Err() != nil:
		case errors.Is(err, ErrFeedRefused):
			// An ACL without the stream commands: the feed keeps to
			// this node. Said once; tried again a minute later.
			w.lastErr.Store(&storeError{msg: err.Error(), at: time.Now()})
			if !refusalSaid {
				refusalSaid = true
				w.log.Info("redis refuses the denial feed's commands to this user, so each node lists only its own denials; grant the user +xadd and +xrevrange to share them",
					zap.String("store", w.store), zap.Error(err))
			}
			pausedUntil = time.Now().Add(feedWarnEvery)
		default:
			w.lastErr.Store(&storeError{msg: err.Error(), at: time.Now()})
			if time.Since(lastWarn) >= feedWarnEvery {
				lastWarn = time.Now()
				w.log.Warn("sending denials to the fleet's denial feed failed (limiting is not affected)",
					zap.String("store", w.store), zap.Error(err))
			}
		}
	}
}

// drain appends what the queue holds to batch, formatted.
func (w *feedWriter) drain(batch []Denial) []Denial {
	for len(batch) < cap(batch) {
		select {
		case d := <-w.feed.queue:
			batch = append(batch, d.export())
		default:
			return batch
		}
	}
	return batch
}

// stop ends the writer and waits for it; what is queued is dropped.
func (w *feedWriter) stop() {
	close(w.quit)
	<-w.done
}
