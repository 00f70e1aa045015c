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
// One concept per file: scenario.go draws, site.go writes the Caddyfile,
// topology.go starts Redis, upstream.go is the application, load.go the
// clients, stream.go the streamed answers and the client that hangs up
// mid-stream, shedroom.go the soft shed's waiting room and its invariant, exempt.go the exempt client and its check, fault.go the faults,
// reset.go the key resets (a DELETE of a key through a node's admin API,
// after which its bound starts again), bans.go and resources.go what the
// nodes expose, bound.go the exact bounds and allowances, invariants.go the
// checks, report.go the violations, run.go one scenario end to end.
package chaos
