// Package chaos is a model-based invariant checker that breaks a local
// fleet on purpose. From a seed it draws a scenario (zones composed of every
// algorithm and policy, clients honest and hostile, a Redis topology and a
// list of faults), runs it over real processes (Caddy nodes built from
// cmd/caddy, real redis-server, a small upstream on loopback), and checks
// what the clients and the upstream observed, and what the nodes expose,
// against the invariants a production rate limiter promises: the exact
// bound of every bucket (with named, sized allowances for what faults may
// cost), no slot held by nobody, no banned key admitted, count_status
// exact, no resource left behind by reloads, no unexpected 5xx.
//
// One concept per file: a Scenario is drawn (each feature from a stream
// of its own, drawFeatures), written as a Caddyfile (Scenario.Site), run
// against its Redis (startBackend), its application (startUpstream), its
// clients (Scenario.load), its faults (injector), its key resets
// (KeyReset, after which a key's bound starts again) and its client of
// Envoy's rate limit service on zones of the site (RLSLoad), then checked
// (checker: the exact bounds and allowances of bucketRule, bans, the soft
// shed's rooms, exemptions, resources) and reported (Violation, Result).
// Run is one scenario end to end.
package chaos
