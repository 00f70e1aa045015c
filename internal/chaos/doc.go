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
// Run is one scenario end to end; docs/design.md, "The invariant checker",
// maps the rest.
package chaos
