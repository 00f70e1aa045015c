package limiter

import "time"

// nodeClock is this node's time source, for what runs on node time: the
// memory store and the deny cache (which uses only its monotonic reading).
// Decisions in Redis never read it: their clock is Redis TIME, the same for
// every node, so a node whose clock is off cannot skew a shared bucket.
// Test builds may shift it (see clock_skew.go).
var nodeClock = time.Now
