// Package config reads the rate limit rules of an Envoy Rate Limit Service
// and finds the rule that applies to a request's descriptor. It reads the
// configuration of envoyproxy/ratelimit unchanged, from YAML files (one
// domain a file, LoadDir) or from RateLimitConfig resources sent over xDS
// (FromXDS), and matches descriptors as that server does (Config.Match).
// It knows nothing of Caddy, gRPC serving or the stores: a service answers
// ShouldRateLimit with what Match returns.
//
// # The reference's format
//
// A file holds one domain and its descriptors:
//
//	domain: api
//	descriptors:
//	  - key: remote_address
//	    rate_limit:
//	      unit: minute
//	      requests_per_unit: 100
//	  - key: path
//	    value: /login
//	    rate_limit: {unit: second, requests_per_unit: 5, name: login}
//
// Every key of envoyproxy/ratelimit is accepted: domain, descriptors (nested
// to any depth), key, value, rate_limit with unit, requests_per_unit,
// unlimited, name and replaces (a list of {name}), shadow_mode, quota_mode,
// detailed_metric, value_to_metric, share_threshold and metadata. Its rules
// hold: a descriptor needs a key, a key and value appear once per level, a
// rule needs a unit (second, minute, hour, day, week, month or year, in any
// case) unless it is unlimited, an unlimited rule takes no unit, replaces
// names neither nothing nor its own rule, share_threshold needs a value
// ending in "*", a domain needs a name and appears in one file only. Any
// other key is refused, and every error names the file and the line.
//
// Where the reference is lenient, so is this package: a known key in a
// place where it means nothing (shadow_mode inside rate_limit, say) is
// ignored as the reference ignores it, and reported in Config.Warnings;
// requests_per_unit 0 is a rule that admits nothing; only the first YAML
// document of a file is read (a warning names the others). Two differences
// make mistakes visible rather than silent: a mapping that repeats a key is
// refused (the reference keeps the last), and a file that cannot be read
// fails the load (the reference skips it).
//
// A value ending in "*" matches every value that starts with the rest; a
// "*" elsewhere is an ordinary character, as in the reference's release
// this package follows (envoyproxy/ratelimit 3fb702589d36, January 2026,
// with metadata from its later releases).
//
// # Extensions
//
// Three keys inside rate_limit go beyond the reference, which refuses them;
// a file that uses them is for this service only:
//
//   - algorithm: how the rule counts, any of the limiter's algorithms by
//     name (token_bucket, leaky_bucket, fixed_window, sliding_window,
//     sliding_log). Without it a rule counts as the reference does, one
//     fixed window per unit. Concurrency is refused: Envoy never reports
//     the end of a request.
//   - burst: the bucket's capacity, for token_bucket and leaky_bucket
//     only. Default: requests_per_unit.
//   - zone: the name of a rate_limit zone of the Caddy configuration; the
//     descriptor then spends the zone's bucket, at the zone's rate. A rule
//     with a zone gives no unit, requests_per_unit, algorithm, burst or
//     unlimited. This package keeps the name; the service resolves it.
//
// RateLimitConfig resources carry none of the extensions, nor quota_mode,
// value_to_metric, share_threshold or metadata: their protocol has no
// field for them.
package config
