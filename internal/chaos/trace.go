package chaos

import (
	"fmt"
	"strings"
	"time"
)

// What a violation's trace shows: the faults, and the requests of the
// client or key it is about around the moment it names.
const (
	traceBefore = 1500 * time.Millisecond
	traceAfter  = 500 * time.Millisecond
	traceMax    = 80 // requests listed at most
)

// failAt records a violation about the requests for which match is true,
// at the moment at, with its trace.
func (c *checker) failAt(inv string, at time.Time, match func(q *request) bool, format string, args ...any) {
	c.out = append(c.out, Violation{Invariant: inv, Detail: fmt.Sprintf(format, args...), Trace: c.trace(at, match)})
}

// trace lists the fault windows, then the requests for which match is true
// that were sent from traceBefore before at to traceAfter after it.
func (c *checker) trace(at time.Time, match func(q *request) bool) string {
	var b strings.Builder
	for _, w := range c.o.windows {
		fmt.Fprintf(&b, "fault %s %s to %s (back on Redis by %s)\n", w.kind,
			w.start.Format("15:04:05.000"), w.end.Format("15:04:05.000"), w.until().Format("15:04:05.000"))
	}
	n := 0
	for _, q := range c.o.requests {
		if !match(q) || q.sent.Before(at.Add(-traceBefore)) || q.sent.After(at.Add(traceAfter)) {
			continue
		}
		if n++; n > traceMax {
			fmt.Fprintf(&b, "... (more requests)\n")
			break
		}
		fmt.Fprintf(&b, "%s %s node %d gen %s %s: %d", q.sent.Format("15:04:05.000"), c.s.Targets[q.target].Path,
			q.node, q.gen, q.done.Sub(q.sent).Round(time.Millisecond), q.status)
		if q.denier != "" {
			fmt.Fprintf(&b, " by %s", q.denier)
		}
		if _, ok := c.o.seen[q.id]; ok {
			b.WriteString(" (upstream saw it)")
		}
		if q.err != "" {
			fmt.Fprintf(&b, " %s", q.err)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ofKey matches the requests of one client key.
func ofKey(key string) func(q *request) bool {
	return func(q *request) bool { return q.key == key }
}

// ofNode matches the requests sent through one node.
func ofNode(node int) func(q *request) bool {
	return func(q *request) bool { return q.node == node }
}

// ofClient matches the requests of one client.
func ofClient(cl *Client) func(q *request) bool {
	return func(q *request) bool { return q.client == cl }
}
