// Package lua holds the Redis scripts that decide rate limits: one file per
// algorithm (each registers its check, commit and refund), a prelude they
// share, and the two entry points, embedded into the binary and assembled
// into the two scripts the limiter loads.
package lua

import (
	_ "embed"
	"strings"
)

var (
	//go:embed prelude.lua
	prelude string
	//go:embed token_bucket.lua
	tokenBucket string
	//go:embed leaky_bucket.lua
	leakyBucket string
	//go:embed fixed_window.lua
	fixedWindow string
	//go:embed sliding_window.lua
	slidingWindow string
	//go:embed sliding_log.lua
	slidingLog string
	//go:embed decide.lua
	decide string
	//go:embed refund.lua
	refund string
)

// algorithms is every algorithm's file, in an order that satisfies their
// references (the leaky bucket reuses the token bucket's functions, the
// sliding window the fixed window's).
var algorithms = []string{tokenBucket, leakyBucket, fixedWindow, slidingWindow, slidingLog}

func assemble(main string) string {
	return strings.Join(append(append([]string{prelude}, algorithms...), main), "\n")
}

// Decide decides one request against all its zones atomically, whatever
// each zone's algorithm; see decide.lua for its keys, arguments and reply.
var Decide = assemble(decide)

// Refund gives back what Decide charged, for a request decided in several
// calls (Redis Cluster slots) that another call denied; see refund.lua.
var Refund = assemble(refund)
