// Command caddy is Caddy with the standard modules, the fleetlimit
// rate_limit handler and its Envoy rate limit service (the rate_limit_rls
// app): what `xcaddy build --with github.com/fleetlimit/caddy-fleetlimit
// --with github.com/fleetlimit/caddy-fleetlimit/rls` produces.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// The standard Caddy modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The rate_limit handler.
	_ "github.com/fleetlimit/caddy-fleetlimit"
	// The Envoy rate limit service, rate_limit_rls.
	_ "github.com/fleetlimit/caddy-fleetlimit/rls"
)

func main() {
	caddycmd.Main()
}
