// Package lua holds the Redis scripts that decide rate limits, one file per
// algorithm, embedded into the binary.
package lua

import _ "embed"

// TokenBucket decides one request against the token buckets of all its
// zones atomically; see token_bucket.lua for its keys, arguments and reply.
//
//go:embed token_bucket.lua
var TokenBucket string

// Refund gives back what TokenBucket charged, for a request decided in
// several calls (Redis Cluster slots) that another call denied; see
// refund.lua.
//
//go:embed refund.lua
var Refund string
