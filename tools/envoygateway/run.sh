#!/usr/bin/env bash
# Runs rate_limit_rls against Envoy Gateway's own control plane, with no
# Kubernetes: Envoy Gateway in standalone mode (file provider, host
# infrastructure) reads standalone/resources.yaml (a Gateway, an HTTPRoute
# and a BackendTrafficPolicy with a global rate limit) and serves its rate
# limit xDS server on port 18001 with mutual TLS, certificates from
# `envoy-gateway certgen --local`. A Caddy built from ./cmd/caddy runs the
# Caddyfile of docs/envoy/envoy-gateway.yaml with the environment Envoy
# Gateway gives its rate limit Deployment, on a redis-server of its own.
# Then egcheck plays Envoy: it reads the rate limit actions Envoy Gateway
# put on the route (its xDS server for Envoy, port 18000), builds the
# descriptors they send for a request with x-user-id: alice, and calls
# ShouldRateLimit until OVER_LIMIT.
#
# Needs go, redis-server, redis-cli and curl; ports 18000, 18001 and 19000-19001 free (Envoy
# Gateway's, fixed). Building Envoy Gateway takes minutes, so this is not
# part of ./test.sh. Envoy Gateway's version is the one in go.mod here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="$(mktemp -d)"
pids=()
cleanup() {
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# free_port prints a loopback port nothing listens on.
free_port() {
	local p
	for _ in $(seq 100); do
		p=$((20000 + RANDOM % 30000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	echo "run.sh: no free port" >&2
	exit 1
}

# wait_port waits until something listens on a loopback port.
wait_port() {
	for _ in $(seq 300); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
			return
		fi
		sleep 0.1
	done
	echo "run.sh: nothing listens on $1 ($2); its log:" >&2
	tail -20 "$work/$2.log" >&2
	exit 1
}

eg_version="$(cd "$here" && go list -m -f '{{.Version}}' github.com/envoyproxy/gateway)"
echo "building envoy-gateway $eg_version, caddy and egcheck" >&2
GOBIN="$work/bin" go install "github.com/envoyproxy/gateway/cmd/envoy-gateway@$eg_version"
(cd "$root" && go build -o "$work/bin/caddy" ./cmd/caddy)
(cd "$here" && go build -o "$work/bin/egcheck" ./cmd/egcheck)

"$work/bin/envoy-gateway" certgen --local --config-home "$work/eg" >"$work/certgen.log" 2>&1
certs="$work/eg/certs"

redis_port="$(free_port)"
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
pids+=($!)
wait_port "$redis_port" redis

mkdir -p "$work/resources"
cp "$here/standalone/resources.yaml" "$work/resources/"
cat >"$work/envoy-gateway.yaml" <<EOF
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: ["$work/resources"]
    infrastructure:
      type: Host
      host:
        configHome: $work/eg
        dataHome: $work/eg/data
        stateHome: $work/eg/state
        runtimeDir: $work/eg/run
extensionApis:
  enableBackend: true
rateLimit:
  backend:
    type: Redis
    redis:
      url: localhost:$redis_port
EOF
"$work/bin/envoy-gateway" server --config-path "$work/envoy-gateway.yaml" >"$work/envoy-gateway.log" 2>&1 &
pids+=($!)
wait_port 18001 envoy-gateway

# The snippet's Caddyfile, its two ports moved to free ones. In a cluster
# the xDS address's host, envoy-gateway, is the name on Envoy Gateway's
# certificate; here the address is 127.0.0.1, so the name is given.
rls_port="$(free_port)"
health_port="$(free_port)"
awk '/^  Caddyfile: \|/ {on = 1; next} on {sub(/^    /, ""); print}' "$root/docs/envoy/envoy-gateway.yaml" |
	sed -e "s/listen :8081/listen 127.0.0.1:$rls_port/" -e "s|http://:8080|http://127.0.0.1:$health_port|" \
		-e 's/^\(\t*\)ca_file \(.*\)/&\n\1server_name envoy-gateway/' >"$work/Caddyfile"
env XDG_CONFIG_HOME="$work/caddy" XDG_DATA_HOME="$work/caddy" \
	CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:18001 \
	CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit \
	CONFIG_GRPC_XDS_CLIENT_TLS_CERT="$certs/envoy-rate-limit/tls.crt" \
	CONFIG_GRPC_XDS_CLIENT_TLS_KEY="$certs/envoy-rate-limit/tls.key" \
	CONFIG_GRPC_XDS_SERVER_TLS_CACERT="$certs/envoy-rate-limit/ca.crt" \
	GRPC_SERVER_TLS_CERT="$certs/envoy-rate-limit/tls.crt" \
	GRPC_SERVER_TLS_KEY="$certs/envoy-rate-limit/tls.key" \
	GRPC_SERVER_TLS_CA_CERT="$certs/envoy-rate-limit/ca.crt" \
	REDIS_URL="localhost:$redis_port" \
	"$work/bin/caddy" run --config "$work/Caddyfile" --adapter caddyfile >"$work/caddy.log" 2>&1 &
pids+=($!)
wait_port "$rls_port" caddy

if ! "$work/bin/egcheck" -certs "$certs" -rls "127.0.0.1:$rls_port"; then
	echo "run.sh: egcheck failed; Envoy Gateway's and Caddy's logs:" >&2
	tail -30 "$work/envoy-gateway.log" "$work/caddy.log" >&2
	exit 1
fi
echo "health check on the Caddyfile's :8080 site: $(curl -fsS "http://127.0.0.1:$health_port/healthcheck")"
echo "keys in Redis: $(redis-cli -p "$redis_port" dbsize)"
echo "Caddy's log, the xDS updates and any store failure (a call the store did not answer in time is decided by on_error):"
grep -e 'over xDS' -e 'NACK' -e 'store failed' "$work/caddy.log" || true
