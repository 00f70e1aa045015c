package chaos

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// upstream is the application behind the fleet, on loopback: it answers
// each request with the status the client asked for (X-Status) after the
// time it asked for (X-Sleep, in ms), marks its answers (X-Upstream), and
// records every request it saw: the requests the fleet admitted. It counts,
// per concurrency zone and key, the requests it holds at once. A request
// may ask for its body as a stream (X-Stream, see streamEnd).
type upstream struct {
	srv  *http.Server
	addr string
	// czones returns the concurrency zones (name and limit) that apply to
	// a path.
	czones func(path string) []*Zone
	// costs says whether and how it reports a real cost of each request
	// in X-Tokens-Used.
	costs costReport

	mu       sync.Mutex
	seen     map[string]seenRequest // by X-Req
	inflight map[string]int64       // by zone and key
	peaks    []peak                 // in-flight counts above a zone's limit
}

// seenRequest is what the upstream saw of an admitted request.
type seenRequest struct {
	at     time.Time // when it arrived
	status int       // what it answered (or would have)
	end    streamEnd // how a streamed answer ended
}

// peak is a moment when more requests of a key were in flight through a
// concurrency zone than its limit.
type peak struct {
	zone, key string
	n         int64
	at        time.Time
}

// startUpstream starts the upstream on a free loopback port; it reports each
// request's real cost as costs says.
func startUpstream(czones func(path string) []*Zone, costs costReport) (*upstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{addr: l.Addr().String(), czones: czones, costs: costs, seen: map[string]seenRequest{}, inflight: map[string]int64{}}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(l) }()
	return u, nil
}

// ServeHTTP answers one request.
func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status, _ := strconv.Atoi(r.Header.Get("X-Status"))
	if status == 0 {
		status = 200
	}
	sleepMs, _ := strconv.Atoi(r.Header.Get("X-Sleep"))
	key := bucketKey(r.Header.Get("X-Key"))
	// An aborting client's slots (and those of a client that hangs up
	// mid-stream) are checked by the probe, not here: its requests end at
	// the proxy before the upstream notices.
	track := r.Header.Get("X-Abort") == ""
	zones := u.czones(r.URL.Path)
	now := time.Now()
	u.mu.Lock()
	if id := r.Header.Get("X-Req"); id != "" {
		u.seen[id] = seenRequest{at: now, status: status}
	}
	if track {
		for _, z := range zones {
			k := z.Name + "|" + key
			u.inflight[k]++
			if n := u.inflight[k]; n > z.Limit {
				u.peaks = append(u.peaks, peak{zone: z.Name, key: key, n: n, at: now})
			}
		}
	}
	u.mu.Unlock()
	if sleepMs > 0 {
		select {
		case <-time.After(time.Duration(sleepMs) * time.Millisecond):
		case <-r.Context().Done():
		}
	}
	w.Header().Set("X-Upstream", "1")
	after := func() {}
	if u.costs.on {
		after = u.costs.report(w, r.Header.Get("X-Req"))
	}
	if end := u.stream(w, r, status, after); end != streamNone {
		u.mu.Lock()
		if id := r.Header.Get("X-Req"); id != "" {
			sr := u.seen[id]
			sr.end = end
			u.seen[id] = sr
		}
		u.mu.Unlock()
	} else {
		w.WriteHeader(status)
		_, _ = w.Write([]byte("up"))
		after()
	}
	if track {
		u.mu.Lock()
		for _, z := range zones {
			u.inflight[z.Name+"|"+key]--
		}
		u.mu.Unlock()
	}
}

// snapshot returns what the upstream saw, and its peaks.
func (u *upstream) snapshot() (map[string]seenRequest, []peak) {
	u.mu.Lock()
	defer u.mu.Unlock()
	seen := make(map[string]seenRequest, len(u.seen))
	for k, v := range u.seen {
		seen[k] = v
	}
	return seen, append([]peak(nil), u.peaks...)
}

// close stops the upstream.
func (u *upstream) close() { _ = u.srv.Close() }

// bucketKey is the client key a per-client zone sees for an X-Key value:
// the value, or the client's address when there is none. The address is
// written apart, so that a key equal to an address is another bucket, as
// the design promises.
func bucketKey(xkey string) string {
	if xkey == "" {
		return "ip:127.0.0.1"
	}
	return xkey
}
