#!/usr/bin/env bash
# Builds ./caddy: Caddy with the standard modules and fleetlimit's rate_limit.
# Uses xcaddy when it is installed, else the repo's own cmd/caddy (which is
# what xcaddy would generate).
set -euo pipefail
cd "$(dirname "$0")"
if command -v xcaddy >/dev/null 2>&1; then
	exec xcaddy build v2.11.9 --output ./caddy --with github.com/fleetlimit/caddy-fleetlimit=.
fi
exec go build -o ./caddy ./cmd/caddy
