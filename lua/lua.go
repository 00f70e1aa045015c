// Package lua holds the Redis scripts that decide rate limits: one file per
// algorithm, in sections that decide.lua, refund.lua and peek.lua inline, a
// prelude they share, and the entry points, embedded and assembled into the
// scripts the limiter loads (docs/design.md, "Inside lua").
package lua

import (
	_ "embed"
	"fmt"
	"strings"
)

var (
	//go:embed prelude.lua
	prelude string
	//go:embed token_bucket.lua
	tokenBucket string
	//go:embed sliding_window.lua
	slidingWindow string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed sliding_log.lua
	slidingLog string
	//go:embed leaky_bucket.lua
	leakyBucket string
	//go:embed concurrency.lua
	concurrency string
	//go:embed quota.lua
	quota string
	//go:embed decide.lua
	decide string
	//go:embed refund.lua
	refund string
	//go:embed peek.lua
	peek string
	//go:embed zone.lua
	unzone string
	//go:embed charged.lua
	charged string
)

// algorithms lists the algorithm files by id (the limiter's Algorithm
// values), in an order that satisfies their helpers' references (the
// sliding window uses the fixed window's, the leaky bucket the token
// bucket's).
var algorithms = []struct {
	id   int
	file string
}{
	{AlgTokenBucket, tokenBucket},
	{AlgFixedWindow, fixedWindow},
	{AlgSlidingWindow, slidingWindow},
	{AlgSlidingLog, slidingLog},
	{AlgLeakyBucket, leakyBucket},
	{AlgConcurrency, concurrency},
	{AlgQuota, quota},
}

// standIn names the section that stands in for a section an algorithm
// file leaves out: a peek is the check of an algorithm whose check writes
// nothing.
var standIn = map[string]string{"peek": "check"}

// sections splits an algorithm file into its marked sections.
func sections(file string) map[string]string {
	out := map[string]string{}
	name := ""
	var b strings.Builder
	for _, line := range strings.SplitAfter(file, "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "--@"); ok {
			if name != "" {
				out[name] = b.String()
			}
			name = m
			b.Reset()
			continue
		}
		if name != "" {
			b.WriteString(line)
		}
	}
	if name != "" {
		out[name] = b.String()
	}
	return out
}

// assemble returns a script: the wire format's header, the prelude, the
// algorithms' helpers, then main with its directives expanded, the wire
// format's names bound to their values.
func assemble(main string) string {
	var b strings.Builder
	b.WriteString(prelude)
	parsed := make([]map[string]string, len(algorithms))
	for i, a := range algorithms {
		parsed[i] = sections(a.file)
		b.WriteString(parsed[i]["helpers"])
	}
	for _, line := range strings.SplitAfter(main, "\n") {
		if strings.TrimSpace(line) == "--@unzone" {
			b.WriteString(unzone)
			continue
		}
		section, ok := strings.CutPrefix(strings.TrimSpace(line), "--@dispatch ")
		if !ok {
			b.WriteString(line)
			continue
		}
		for i, a := range algorithms {
			kw := "elseif"
			if i == 0 {
				kw = "if"
			}
			code, ok := parsed[i][section]
			if !ok {
				code = parsed[i][standIn[section]]
			}
			fmt.Fprintf(&b, "%s alg == %d then\n%s", kw, a.id, code)
		}
		b.WriteString("end\n")
	}
	return header() + bind(b.String())
}

// Decide decides one request against all its zones atomically, whatever
// each zone's algorithm; see decide.lua for its keys, arguments and reply.
var Decide = assemble(decide)

// Refund gives back what Decide charged, for a request decided in several
// calls (Redis Cluster slots) that another call denied; see refund.lua.
var Refund = assemble(refund)

// Peek reads, without writing anything or charging any zone, what each
// zone's bucket holds for a key, and its ban; see peek.lua for its reply.
var Peek = assemble(peek)

// Charged records, by Redis' clock, that a node's charges are in after an
// outage, and counts the nodes whose are; see charged.lua. It shares no
// part of the wire format, and is loaded as it is written.
var Charged = charged
