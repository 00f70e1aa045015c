#!/usr/bin/env bash
# Runs the test suite: `go test -race -count=1 ./...`, with any arguments
# passed through (./test.sh -run TestX ./limiter/).
#
# The suite needs a C compiler (-race needs cgo) and starts real
# processes: redis-server and redis-cli, nginx, chromium and stress-ng, and
# promtool, wrk or redis-sentinel once a test uses them. What is missing is
# installed with apt-get when this runs as root; otherwise the script names
# it in one line and exits 1.
set -euo pipefail
cd "$(dirname "$0")"

# A binary is found on PATH or in the sbin directories, which are not on
# every user's PATH (Debian's nginx is /usr/sbin/nginx; the tests look
# there too).
have() {
	command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/local/sbin/$1" ] || [ -x "/sbin/$1" ]
}

# used reports whether a test, or a test helper under internal/, names the
# binary in quotes, as they do where they run it.
used() {
	grep -rqs --include='*_test.go' -e "\"$1\"" . || grep -rqs --include='*.go' -e "\"$1\"" internal
}

if ! command -v go >/dev/null 2>&1; then
	echo "test.sh: go is not on PATH: install Go 1.26 or later (https://go.dev/dl/)" >&2
	exit 1
fi

need=()
want() { # want BINARY DEBIAN-PACKAGE
	if ! have "$1" && [[ " ${need[*]} " != *" $2 "* ]]; then
		need+=("$2")
	fi
}
# -race needs cgo, so a C compiler (Go's CC, gcc unless set).
cc="$(go env CC)"
want "${cc%% *}" gcc
want redis-server redis-server
want redis-cli redis-tools
want nginx nginx
want chromium chromium
want stress-ng stress-ng
for optional in promtool:prometheus wrk:wrk redis-sentinel:redis-sentinel; do
	if used "${optional%%:*}"; then
		want "${optional%%:*}" "${optional#*:}"
	fi
done

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "test.sh: the tests need ${need[*]}: install them (Debian: sudo apt-get install ${need[*]}) or run ./test.sh as root" >&2
		exit 1
	fi
	echo "test.sh: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi

# Every tool is here now, so a test that would skip for want of one fails
# instead: no skip passes for a pass.
export CI="${CI:-true}"

# ./... unless an argument names packages. go test's flags that take a value
# in the next argument are told apart by the flags that take none.
bool_flags=" -v -race -short -failfast -json -cover -benchmem -a -n -x -msan -asan -trimpath -fullpath -work "
pkgs=false
prev=""
for arg in "$@"; do
	[ "$arg" = "-args" ] && break
	if [[ "$arg" != -* ]] && ! { [[ "$prev" == -* && "$prev" != *=* && "$bool_flags" != *" ${prev/#--/-} "* ]]; }; then
		pkgs=true
	fi
	prev="$arg"
done
if $pkgs; then
	exec go test -race -count=1 "$@"
fi
# ./tests runs longest (real Caddy, Redis and Chromium processes), its
# tests one package's at a time, while the other packages take far less
# together. So two go test processes share the machine: one runs ./tests,
# the other the other packages and then the tests of ./tests in $beside:
# the outage tests, whose time is windows of load and faults (seconds no
# CPU shortens), and TestFleetPrefetch, which must offer its load on a
# machine that ./tests' heavier half has left. They take about as long as
# the two processes would otherwise differ. Its output is printed when both
# are done.
for arg in "$@"; do
	case "$arg" in -run | -run=* | -skip | -skip=* | -test.run* | -test.skip*)
		exec go test -race -count=1 ./tests ./... "$@" ;;
	esac
done
beside='^(TestOutageFailover|TestOutagePause|TestOutageEmptyRestart|TestFleetPrefetch)$'
others=()
while IFS= read -r pkg; do
	[ "$pkg" != "$(go list ./tests)" ] && others+=("$pkg")
done < <(go list ./...)
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
{
	rc=0
	go test -race -count=1 "${others[@]}" "$@" || rc=$?
	go test -race -count=1 -run "$beside" ./tests "$@" || rc=$?
	exit "$rc"
} >"$out" 2>&1 &
second=$!
rc=0
go test -race -count=1 -skip "$beside" ./tests "$@" || rc=$?
wait "$second" || rc=$?
echo "--- the other packages, then the tests of ./tests in $beside:"
cat "$out"
exit "$rc"
