package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/internal/rlsload"
)

// The hang measurement (-rls-hang) times the answers of the Envoy rate
// limit service while Redis hangs (SIGSTOP): for each on_error policy, a
// Caddy running the rate_limit_rls app alone on a fresh redis-server with
// the redis block's defaults (a 25ms timeout, the breaker's five failures
// and its cooldown), warmed up; then Redis is stopped, the closed-loop
// load of Envoy's calls (a 20ms deadline, 1,000 keys) runs for -duration,
// and Redis is resumed. A last run keeps the breaker from opening, so that
// every call waits for the store as long as its deadline lets it: half the
// time left, 10ms of Envoy's 20ms.

// hangConfig is the rule of the hang measurement: far more than the load
// asks, so that the policy's answers are the only denials.
const hangConfig = "domain: " + rlsDomain + "\ndescriptors:\n  - key: " + rlsKey + "\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000000\n"

// hangCase is one service configuration under a hanging Redis.
type hangCase struct {
	policy  string
	breaker string // the redis block's breaker line, empty for the default
	note    string
}

var hangCases = []hangCase{
	{policy: "deny", note: "default breaker"},
	{policy: "allow", note: "default breaker"},
	{policy: "local", note: "default breaker"},
	{policy: "deny", breaker: "breaker_failures 1000000", note: "breaker never opens"},
}

// runRLSHang runs the hang measurement and prints its table.
func runRLSHang(e *env, o options) {
	m := describeMachine()
	fmt.Fprintf(os.Stderr, "machine: %d CPUs (nproc %s), %s, %s, kernel %s, load average %s\n", m.NumCPU, m.Allowed, m.CPUModel, m.GoVersion, m.Kernel, m.LoadAvg)
	configDir := filepath.Join(e.TempDir(), "ratelimit", "config")
	if err := os.MkdirAll(configDir, 0o755); err != nil {
		e.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(configDir, rlsDomain+".yaml"), []byte(hangConfig), 0o644); err != nil {
		e.Fatal(err)
	}
	caddyBin := o.caddy
	if caddyBin == "" {
		fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
		var err error
		if caddyBin, err = localfleet.BuildCaddy(e.TempDir()); err != nil {
			e.Fatal(err)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nRedis stopped (SIGSTOP); %d closed-loop callers, 20 ms deadline, 1,000 keys, %s per run; redis timeout 25 ms (the default)\n\n", o.rlsCallers, o.duration)
	b.WriteString("| on_error | breaker | calls | answers | missed the deadline | other errors | p50 | p99 | p99.9 | max | load average |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range hangCases {
		r, load := measureHang(e, caddyBin, configDir, c, o)
		fmt.Fprintf(&b, "| %s | %s | %d | %d OK, %d OVER_LIMIT | %d | %d | %s | %s | %s | %s | %s |\n", c.policy, c.note, r.Calls, r.OK, r.OverLimit,
			r.Missed, r.Errors, r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.P999.Round(10*time.Microsecond), r.Max.Round(10*time.Microsecond), load)
		if r.FirstError != "" {
			fmt.Fprintf(os.Stderr, "on_error %s, %s: first error: %s\n", c.policy, c.note, r.FirstError)
		}
	}
	fmt.Print(b.String())
}

// measureHang starts Redis and the service of case c, stops Redis, and
// measures one load; it returns the load's result and the load average at
// its start.
func measureHang(e *env, caddyBin, configDir string, c hangCase, o options) (rlsload.Result, string) {
	redis := redistest.Start(e)
	dir := e.TempDir()
	port := redistest.FreePort(e)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tpersist_config off\n\trate_limit_rls {\n\t\tlisten 127.0.0.1:%d\n\t\tconfig_dir %s\n\t\ton_error %s\n\t\tredis {\n\t\t\taddress %s\n\t\t\t%s\n\t\t}\n\t}\n}\n",
		port, configDir, c.policy, redis.Addr, c.breaker)
	cfgPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		e.Fatal(err)
	}
	cmd := choosePinning(true).command("", caddyBin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	s := startRLSProcess(e, "fleetlimit", cmd, port) // answers once connected to Redis
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.Fatal(err)
	}
	defer conn.Close()
	l := rlsload.Load{Domain: rlsDomain, Key: rlsKey, Keys: 1000, Callers: o.rlsCallers, Duration: o.duration}
	if o.warmup > 0 {
		w := l
		w.Duration = o.warmup
		if _, err := rlsload.Run(context.Background(), conn, w); err != nil {
			e.Fatal(err)
		}
	}
	load := loadAverage()
	redis.Pause()
	defer redis.Resume()
	r, err := rlsload.Run(context.Background(), conn, l)
	if err != nil {
		e.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "on_error %s, %s: %d calls, p99.9 %s, load average %s\n", c.policy, c.note, r.Calls, r.P999, load)
	return r, load
}
