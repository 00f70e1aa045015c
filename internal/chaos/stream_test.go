package chaos

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestHangUpDraws: about two seeds in three add a client that hangs up
// mid-stream, never on the victim's or the exempt client's target, with a
// status that a count_status zone of its targets counts when one counts
// 200, 401 or 500; it hangs up on four requests in five.
func TestHangUpDraws(t *testing.T) {
	t.Parallel()
	with, counting := 0, 0
	for seed := uint64(1); seed <= 300; seed++ {
		s := Draw(seed, Options{})
		for _, c := range s.Clients {
			if c.Kind != KindHangUp {
				continue
			}
			with++
			if !c.HangUp || c.Stream < 2 || c.StreamGap <= 0 || len(c.Targets) == 0 {
				t.Errorf("seed %d: hang-up client %+v", seed, *c)
			}
			for _, ti := range c.Targets {
				if ti == s.VictimTarget || (s.Exempt != nil && ti == s.Exempt.Target) {
					t.Errorf("seed %d: the hang-up client sends to the victim's or the exempt client's target %d", seed, ti)
				}
			}
			if s.countsAny(c.Targets, 200) || s.countsAny(c.Targets, 401) || s.countsAny(c.Targets, 500) {
				counting++
				if !s.countsAny(c.Targets, c.Status) {
					t.Errorf("seed %d: the hang-up client's status %d is counted by no count_status zone of its targets", seed, c.Status)
				}
			}
		}
	}
	t.Logf("of 300 seeds, %d draw a hang-up client, %d of them on a count_status zone", with, counting)
	if with < 150 || with > 250 || counting == 0 {
		t.Errorf("%d of 300 seeds drew a hang-up client (%d on a count_status zone), want about two in three", with, counting)
	}
	c := &Client{HangUp: true}
	hung := 0
	for i := range 10 {
		if c.hangsUp(i) {
			hung++
		}
	}
	if hung != 8 {
		t.Errorf("the client hangs up on %d of 10 requests, want 8", hung)
	}
}

// TestUpstreamStreams runs the upstream on loopback: a stream read whole
// ends with the cost in its trailer (after a decoy header when it reports
// both ways), a HEAD's answer has neither body nor trailer, and a stream
// whose client hangs up after its first chunk is cut before its trailer,
// which the upstream records.
func TestUpstreamStreams(t *testing.T) {
	t.Parallel()
	up, err := startUpstream(func(string) []*Zone { return nil }, costReport{on: true, both: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.close)
	id := trailerID()
	cost, _ := reportedCost(id)
	get := func(id string, hangUp bool) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, "http://"+up.addr+"/t0", nil)
		req.Header.Set("X-Req", id)
		h := req.Header
		(&Client{Stream: 4, StreamGap: 10 * time.Millisecond, HangUp: hangUp}).askStream(h, 0)
		resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := get(id, false)
	if got := resp.Header.Get(costHeaderName); got != strconv.Itoa(decoyCost) {
		t.Errorf("the header says %q, want the decoy %d", got, decoyCost)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || len(body) == 0 {
		t.Fatalf("reading the stream: %q, %v", body, err)
	}
	if got := resp.Trailer.Get(costHeaderName); got != strconv.FormatInt(cost, 10) {
		t.Errorf("the trailer says %q, want %d", got, cost)
	}
	if end := waitEnd(up, id); end != streamWhole {
		t.Errorf("a stream read whole ended %d, want streamWhole", end)
	}

	head, _ := http.NewRequest(http.MethodHead, "http://"+up.addr+"/t0", nil)
	head.Header.Set("X-Req", id+"-head")
	(&Client{Stream: 4, StreamGap: 10 * time.Millisecond}).askStream(head.Header, 0)
	if resp, err := http.DefaultClient.Do(head); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if len(body) != 0 || resp.Trailer.Get(costHeaderName) != "" {
			t.Errorf("a HEAD's answer: body %q, trailer %q; want neither", body, resp.Trailer.Get(costHeaderName))
		}
	}

	cut := id + "-hangup"
	resp = get(cut, true)
	if _, hungUp, err := readBody(resp, true); !hungUp || err != nil {
		t.Fatalf("hanging up: %v, %v", hungUp, err)
	}
	resp.Body.Close()
	if end := waitEnd(up, cut); end != streamCut {
		t.Errorf("a stream whose client hung up ended %d, want streamCut", end)
	}
}

// trailerID returns a request id whose cost the upstream reports in a
// trailer, from 1 to 7.
func trailerID() string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("stream-%d", i)
		if c, tr := reportedCost(id); tr && c > 0 && c < 8 {
			return id
		}
	}
}

// waitEnd waits, up to 3 s, for the upstream to record how the stream of
// request id ended.
func waitEnd(up *upstream, id string) streamEnd {
	deadline := time.Now().Add(3 * time.Second)
	for {
		seen, _ := up.snapshot()
		if e := seen[id].end; e != streamNone || time.Now().After(deadline) {
			return e
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSettledCosts: a cost_header zone charges what the trailer says, not
// the header before it; a request whose trailer never came (a stream cut
// off, a HEAD) the zone's abort charge: by default the up-front cost plus
// the burst, else the larger of its abort and the up-front cost, and its
// quota the same tokens; where the checker cannot tell which the proxy
// saw, the lesser.
func TestSettledCosts(t *testing.T) {
	t.Parallel()
	z := &Zone{Name: "z0", Algorithm: TokenBucket, Rate: 10, Per: time.Second, Burst: 20, CostHeader: true, Quota: 100}
	s := &Scenario{Topology: Memory, Nodes: 1, Zones: []*Zone{z}, HeaderAndTrailer: true}
	id := trailerID()
	real, _ := reportedCost(id)
	var header string
	for i := 0; header == ""; i++ {
		if c, tr := reportedCost(fmt.Sprint("h-", i)); !tr && c > 0 && c < 20 {
			header = fmt.Sprint("h-", i)
		}
	}
	headerCost, _ := reportedCost(header)
	at := time.Now()
	settled := func(id string, end streamEnd, head bool, abort int64, quota bool) float64 {
		z.CostAbort = abort
		q := &request{id: id, client: &Client{Cost: 3}, cost: 3, sent: at, done: at, status: 200, fromApp: true, head: head}
		c := &checker{s: s, o: &observed{seen: map[string]seenRequest{id: {at: at, status: 200, end: end}}}}
		if quota {
			return c.settledQuota(z, q, 3)
		}
		return c.settledCost(z, q, 3)
	}
	for _, tc := range []struct {
		name  string
		id    string
		end   streamEnd
		head  bool
		abort int64
		quota bool
		want  float64
	}{
		{"a trailer read whole", id, streamWhole, false, 0, false, float64(real)},
		{"a trailer, not streamed", id, streamNone, false, 0, false, float64(real)},
		{"a trailer cut off", id, streamCut, false, 0, false, 3 + 20},
		{"a trailer cut off, the quota", id, streamCut, false, 0, true, 3 + 20},
		{"a trailer cut off, abort 5", id, streamCut, false, 5, false, 5},
		{"a trailer cut off, abort 1", id, streamCut, false, 1, false, 3},
		{"a trailer cut off, abort 60", id, streamCut, false, 60, false, 3 + 20},
		{"a trailer cut off, abort 60, the quota", id, streamCut, false, 60, true, 60},
		{"a trailer of a HEAD", id, streamWhole, true, 0, false, 3 + 20},
		{"a trailer maybe cut off", id, streamLate, false, 0, false, float64(min(real, 23))},
		{"a header, cut off after it", header, streamCut, false, 5, false, float64(headerCost)},
		{"a header, of a HEAD", header, streamWhole, true, 5, false, float64(headerCost)},
	} {
		if got := settled(tc.id, tc.end, tc.head, tc.abort, tc.quota); got != tc.want {
			t.Errorf("%s (reported %d): settled %v, want %v", tc.name, real, got, tc.want)
		}
	}
}
