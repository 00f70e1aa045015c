// Command caddy is Caddy with the standard modules and the fleetlimit
// rate_limit handler: what `xcaddy build --with
// github.com/fleetlimit/caddy-fleetlimit` produces.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// The standard Caddy modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The rate_limit handler.
	_ "github.com/fleetlimit/caddy-fleetlimit"
)

func main() {
	caddycmd.Main()
}
