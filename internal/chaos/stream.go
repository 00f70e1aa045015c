package chaos

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// Streamed answers, and a client that hangs up mid-stream: a cost that
// comes in a trailer must still be paid by a client that leaves. The
// upstream holds a stream whose client is to hang up until the proxy
// cancels it, so that the checker knows what the proxy saw (docs/design.md,
// "Streamed answers and hang-ups").

// KindHangUp is the client that hangs up mid-stream.
const KindHangUp = "hangup"

// hangUpWait bounds how long the upstream waits, after the first chunk of
// a request whose client hangs up, for the proxy to cancel the request.
const hangUpWait = 3 * time.Second

// streamEnd is how a streamed answer ended, as the upstream saw it.
type streamEnd uint8

const (
	streamNone  streamEnd = iota // not streamed
	streamWhole                  // every chunk and the trailer sent
	streamCut                    // cut before its end: no trailer was sent
	streamLate                   // the client was to leave, the proxy did not cancel in time: sent whole, its fate unknown
)

// drawHangUp adds, from its own stream, in two scenarios of
// three, a client that hangs up mid-stream, on the targets where it
// matters most (a count_status or a cost_header zone), never the victim's
// nor the exempt client's, with a status one of their count_status zones
// counts: three to five workers as fast as answers come, each request's
// cost 2 or 3, so that a bucket that gives back what it must not lets it
// far past its bound.
func (s *Scenario) drawHangUp(r *rand.Rand) {
	if r.IntN(3) == 0 {
		return
	}
	var first, rest []int
	for ti := range s.Targets {
		if ti == s.VictimTarget || (s.Exempt != nil && ti == s.Exempt.Target) {
			continue
		}
		if s.hasCountStatus(ti) || s.hasCostHeaderZone(ti) {
			first = append(first, ti)
		} else {
			rest = append(rest, ti)
		}
	}
	pool := append(first, rest...)
	if len(pool) == 0 {
		return
	}
	c := &Client{ID: len(s.Clients), Kind: KindHangUp, Key: fmt.Sprintf("hangup-%x", s.Seed%0xfff),
		Tier: pick(r, "gold", "default", "none"), Cost: pick(r, int64(2), 3), Workers: 3 + r.IntN(3),
		Stream: 3 + r.IntN(3), StreamGap: time.Duration(10+r.IntN(20)) * time.Millisecond, HangUp: true}
	c.Targets = []int{pool[0]}
	if len(first) > 1 && r.IntN(2) == 0 {
		c.Targets = append(c.Targets, pool[1])
	}
	c.Status = s.countedStatus(c.Targets, r)
	s.Clients = append(s.Clients, c)
}

// hasCostHeaderZone reports whether a zone of target t has cost_header.
func (s *Scenario) hasCostHeaderZone(t int) bool {
	for _, zi := range s.Targets[t].Zones {
		if s.Zones[zi].CostHeader {
			return true
		}
	}
	return false
}

// countedStatus returns a status that a count_status zone of the targets
// counts, 200 or 401 rather than 500 (a panic's status, which an abandoned
// stream must not be taken for), and 200 when no zone counts by status.
func (s *Scenario) countedStatus(targets []int, r *rand.Rand) int {
	var can []int
	for _, ti := range targets {
		for _, zi := range s.Targets[ti].Zones {
			for _, st := range []int{200, 401} {
				if z := s.Zones[zi]; len(z.CountStatus) > 0 && counted(z.CountStatus, st) {
					can = append(can, st)
				}
			}
		}
	}
	switch {
	case len(can) > 0:
		return can[r.IntN(len(can))]
	case s.countsAny(targets, 500):
		return 500
	}
	return 200
}

// countsAny reports whether a count_status zone of the targets counts
// status.
func (s *Scenario) countsAny(targets []int, status int) bool {
	for _, ti := range targets {
		for _, zi := range s.Targets[ti].Zones {
			if z := s.Zones[zi]; len(z.CountStatus) > 0 && counted(z.CountStatus, status) {
				return true
			}
		}
	}
	return false
}

// hangsUp reports whether the client hangs up on its i-th request: a
// hang-up client does on all but every fifth.
func (c *Client) hangsUp(i int) bool { return c.HangUp && i%5 != 4 }

// method is the method of c's i-th request: a HEAD for one in ten of a
// hang-up client's (one it would have read whole: the answer has no body,
// so its trailer never comes), else GET.
func (c *Client) method(i int) string {
	if c.HangUp && i%10 == 9 {
		return http.MethodHead
	}
	return http.MethodGet
}

// answerTime is how long the upstream takes to answer one of c's requests
// whole: its sleep, and the gaps of a stream.
func (c *Client) answerTime() time.Duration {
	if c.Stream > 1 {
		return c.Sleep + time.Duration(c.Stream-1)*c.StreamGap
	}
	return c.Sleep
}

// askStream asks, in h, for the answer of c's i-th request as a stream,
// and says whether its client will hang up on it.
func (c *Client) askStream(h http.Header, i int) {
	if c.Stream <= 0 {
		return
	}
	h.Set("X-Stream", strconv.Itoa(c.Stream))
	h.Set("X-Stream-Gap", strconv.Itoa(int(c.StreamGap/time.Millisecond)))
	if c.hangsUp(i) {
		h.Set("X-Hang-Up", "1")
		// As an aborter's: its slots are checked by the probe, not by
		// the upstream's in-flight counts.
		h.Set("X-Abort", "1")
	}
}

// readBody reads an answer's body: whole, or, when the client hangs up on
// a streamed answer of the upstream, its first chunk, after which closing
// the body closes the connection. It returns the body read (at most 4 KiB)
// and whether the client hung up; err is a failure to read it whole.
func readBody(resp *http.Response, hangUp bool) (body []byte, hungUp bool, err error) {
	if hangUp && resp.Header.Get("X-Upstream") != "" {
		buf := make([]byte, 64)
		n, err := resp.Body.Read(buf)
		if n == 0 && err != nil {
			return nil, false, err
		}
		return buf[:n], true, nil
	}
	body, err = io.ReadAll(io.LimitReader(resp.Body, 4096))
	return body, false, err
}

// stream answers a request that asked for a stream (X-Stream chunks,
// X-Stream-Gap ms apart) with status, and the cost report's trailer after
// its last chunk (after); a request whose client hangs up (X-Hang-Up) gets
// its first chunk only, until the proxy cancels it; a HEAD its header only.
// It returns how the stream ended, streamNone when the request asked for
// none.
func (u *upstream) stream(w http.ResponseWriter, r *http.Request, status int, after func()) streamEnd {
	chunks, _ := strconv.Atoi(r.Header.Get("X-Stream"))
	if chunks <= 0 {
		return streamNone
	}
	gapMs, _ := strconv.Atoi(r.Header.Get("X-Stream-Gap"))
	gap := time.Duration(gapMs) * time.Millisecond
	hangUp := r.Header.Get("X-Hang-Up") != ""
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		// No body to stream: the proxy has the whole answer with the
		// header, and so must the upstream's count of requests in
		// flight.
		return streamWhole
	}
	rc := http.NewResponseController(w)
	end := streamWhole
	for i := range chunks {
		if i > 0 {
			wait := gap
			if i == 1 && hangUp {
				wait = hangUpWait
			}
			select {
			case <-time.After(wait):
				if i == 1 && hangUp {
					end = streamLate
				}
			case <-r.Context().Done():
				return streamCut
			}
		}
		if _, err := fmt.Fprintf(w, "data: chunk %d of %d\n\n", i+1, chunks); err != nil {
			return streamCut
		}
		if rc.Flush() != nil {
			return streamCut
		}
	}
	if r.Context().Err() != nil {
		return streamCut
	}
	after()
	return end
}

// countHangUps adds to the figures how the streams of the clients that hang
// up ended: cut before their trailer, read whole, or unknown to the
// checker (the proxy did not cancel in time).
func (c *checker) countHangUps() {
	var n [4]int
	for _, q := range c.o.requests {
		if q.client.Kind == KindHangUp {
			n[c.o.seen[q.id].end]++
		}
	}
	if n[streamCut]+n[streamWhole]+n[streamLate] > 0 {
		c.figures = append(c.figures, fmt.Sprintf("hang-up client: %d streams cut by its leaving, %d read whole, %d it left that the proxy did not cancel within %s",
			n[streamCut], n[streamWhole], n[streamLate], hangUpWait))
	}
}

// streamSummary describes, for Summary, the client that hangs up and an
// upstream that reports costs both ways: "" for neither.
func (s *Scenario) streamSummary() string {
	out := ""
	for _, c := range s.Clients {
		if c.Kind == KindHangUp {
			out += " (one hangs up mid-stream)"
		}
	}
	if s.HeaderAndTrailer {
		out += " (costs in a header and a trailer)"
	}
	return out
}
