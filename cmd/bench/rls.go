package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/internal/rlsload"
)

// The RLS comparison (-rls) loads fleetlimit's rate_limit_rls app and the
// reference Envoy rate limit service, envoyproxy/ratelimit, with the same
// closed-loop ShouldRateLimit calls (20 ms deadline, one descriptor per
// call), on one key and on -keys keys. Both read the same config file, in
// the reference's YAML, and count in the same fresh redis-server. Each
// service runs pinned to the service CPU, Redis and the load generator to
// the other; the reference with its defaults and its statistics off.

// rlsDomain and rlsKey are the config's domain and its descriptor's key;
// the limit is one no run reaches, so every decision is a charge that
// admits.
const (
	rlsDomain = "bench"
	rlsKey    = "client"
	rlsConfig = "domain: " + rlsDomain + "\ndescriptors:\n  - key: " + rlsKey + "\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000000000\n"
)

// rlsServer is one rate limit service under load.
type rlsServer struct {
	Name string
	Addr string // gRPC host:port
	PID  int
}

// rlsRun is one measured load of one service.
type rlsRun struct {
	Server, Load string
	Round        int
	Result       rlsload.Result
	ServiceCPU   time.Duration // the service's CPU over the load
	RedisCPU     time.Duration // Redis' CPU over the load
	// Evalsha counts the script calls over the load, RedisReads the
	// round trips (Redis' read events).
	Evalsha, RedisReads int64
	LoadAvg             string // /proc/loadavg's first three fields, before the load
}

// runRLS runs the RLS comparison and prints its table.
func runRLS(e *env, o options) {
	pin := choosePinning(!o.pin)
	m := describeMachine()
	fmt.Fprintf(os.Stderr, "machine: %d CPUs (nproc %s), %s, %s, kernel %s, load average %s\n", m.NumCPU, m.Allowed, m.CPUModel, m.GoVersion, m.Kernel, m.LoadAvg)
	fmt.Fprintf(os.Stderr, "pinning: %s\n", pin)

	configDir := filepath.Join(e.TempDir(), "ratelimit", "config")
	if err := os.MkdirAll(configDir, 0o755); err != nil {
		e.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(configDir, rlsDomain+".yaml"), []byte(rlsConfig), 0o644); err != nil {
		e.Fatal(err)
	}
	redis := redistest.Start(e)
	if pid, err := redisPID(redis); err != nil || pid == 0 {
		e.Fatalf("redis process id: %v", err)
	} else if err := pin.pinPID(pin.loadCPU, pid); err != nil {
		e.Fatal(err)
	}
	if err := pin.pinPID(pin.loadCPU, os.Getpid()); err != nil {
		e.Fatal(err)
	}

	refBin := o.rlsRef
	var err error
	if refBin == "" {
		fmt.Fprintln(os.Stderr, "building the reference's service_cmd from the tools module ...")
		if refBin, err = localfleet.BuildReference(e.TempDir(), "service_cmd"); err != nil {
			e.Fatal(err)
		}
	}
	servers := []*rlsServer{startReference(e, pin, refBin, configDir, redis.Addr)}
	caddyBin := o.caddy
	if caddyBin == "" {
		fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
		if caddyBin, err = localfleet.BuildCaddy(e.TempDir()); err != nil {
			e.Fatal(err)
		}
	}
	if hasModule(caddyBin, "rate_limit_rls") {
		servers = append(servers, startFleetlimitRLS(e, pin, caddyBin, configDir, redis.Addr))
	} else {
		fmt.Fprintln(os.Stderr, "this caddy has no rate_limit_rls module: measuring the reference alone")
	}

	loads := []rlsload.Load{
		{Domain: rlsDomain, Key: rlsKey, Keys: 1},
		{Domain: rlsDomain, Key: rlsKey, Keys: o.keys},
	}
	var runs []rlsRun
	for round := 1; round <= o.rounds; round++ {
		for _, l := range loads {
			for _, s := range servers {
				l.Callers, l.Duration = o.rlsCallers, o.duration
				r := measureRLS(e, s, redis, l, o.warmup)
				r.Round = round
				runs = append(runs, r)
				fmt.Fprintf(os.Stderr, "round %d, %s, %s: %d calls in %s, p99 %s, load average %s\n", round, r.Server, r.Load, r.Result.Calls, r.Result.Elapsed.Round(time.Millisecond), r.Result.P99, r.LoadAvg)
			}
		}
	}
	fmt.Print(rlsTable(runs, o.rlsCallers))
}

// loadName names a load in the table.
func loadName(l rlsload.Load) string {
	if l.Keys <= 1 {
		return "1 key"
	}
	if l.Keys%1000 == 0 {
		return fmt.Sprintf("%dk keys", l.Keys/1000)
	}
	return fmt.Sprintf("%d keys", l.Keys)
}

// measureRLS warms s up with l, then measures one load of l.Duration.
func measureRLS(e *env, s *rlsServer, redis *redistest.Server, l rlsload.Load, warmup time.Duration) rlsRun {
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.Fatal(err)
	}
	defer conn.Close()
	if warmup > 0 {
		w := l
		w.Duration = warmup
		if _, err := rlsload.Run(context.Background(), conn, w); err != nil {
			e.Fatal(err)
		}
	}
	run := rlsRun{Server: s.Name, Load: loadName(l), LoadAvg: loadAverage()}
	cpu0, err := cpuTime(s.PID)
	if err != nil {
		e.Fatal(err)
	}
	info0, err := readRedisInfo(redis)
	if err != nil {
		e.Fatal(err)
	}
	if run.Result, err = rlsload.Run(context.Background(), conn, l); err != nil {
		e.Fatal(err)
	}
	cpu1, err := cpuTime(s.PID)
	if err != nil {
		e.Fatal(err)
	}
	info1, err := readRedisInfo(redis)
	if err != nil {
		e.Fatal(err)
	}
	run.ServiceCPU = cpu1 - cpu0
	run.RedisCPU = time.Duration((info1.CPU - info0.CPU) * float64(time.Second))
	run.Evalsha = info1.EvalshaCalls - info0.EvalshaCalls
	run.RedisReads = info1.Reads - info0.Reads
	return run
}

// rlsTable renders the runs as a Markdown table, one row per run.
func rlsTable(runs []rlsRun, callers int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d closed-loop callers, 20 ms deadline, one descriptor per call; CPU per decision (call)\n\n", callers)
	b.WriteString("| round | service | load | calls/s | service CPU/decision | Redis CPU/decision | EVALSHA/decision | Redis round trips/decision | p50 | p99 | missed or failed | load average |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		per := func(d time.Duration) string {
			if r.Result.Calls == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f µs", float64(d.Microseconds())/float64(r.Result.Calls))
		}
		perCall := func(n int64) string {
			if r.Result.Calls == 0 {
				return "-"
			}
			return fmt.Sprintf("%.3f", float64(n)/float64(r.Result.Calls))
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %.2f%% | %s |\n", r.Round, r.Server, r.Load, r.Result.PerSecond(),
			per(r.ServiceCPU), per(r.RedisCPU), perCall(r.Evalsha), perCall(r.RedisReads), r.Result.P50.Round(10*time.Microsecond), r.Result.P99.Round(10*time.Microsecond),
			100*r.Result.FailedShare(), r.LoadAvg)
		if r.Result.FirstError != "" {
			fmt.Fprintf(os.Stderr, "%s, %s, round %d: first error: %s\n", r.Server, r.Load, r.Round, r.Result.FirstError)
		}
	}
	return b.String()
}

// loadAverage returns the 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// hasModule reports whether the Caddy binary bin has the module id.
func hasModule(bin, id string) bool {
	out, err := exec.Command(bin, "list-modules").Output()
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.TrimSpace(line) == id {
			return true
		}
	}
	return false
}

// startReference runs the reference's service_cmd on free loopback ports,
// reading configDir, with its defaults but for statistics (off), and
// waits until it answers.
func startReference(e *env, pin pinning, bin, configDir, redisAddr string) *rlsServer {
	runtimeDir := filepath.Dir(configDir)
	port := redistest.FreePort(e)
	env := []string{
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(redistest.FreePort(e)),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(redistest.FreePort(e)),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(port),
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + filepath.Dir(runtimeDir), "RUNTIME_SUBDIRECTORY=" + filepath.Base(runtimeDir),
		"RUNTIME_WATCH_ROOT=false", "USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=warn",
	}
	cmd := pin.command(pin.caddyCPU, bin)
	cmd.Env = append(os.Environ(), env...)
	return startRLSProcess(e, "envoyproxy/ratelimit", cmd, port)
}

// startFleetlimitRLS runs Caddy with the rate_limit_rls app alone, reading
// configDir, and waits until it answers.
func startFleetlimitRLS(e *env, pin pinning, bin, configDir, redisAddr string) *rlsServer {
	dir := e.TempDir()
	port := redistest.FreePort(e)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tpersist_config off\n\trate_limit_rls {\n\t\tlisten 127.0.0.1:%d\n\t\tconfig_dir %s\n\t\tredis {\n\t\t\taddress %s\n\t\t}\n\t}\n}\n", port, configDir, redisAddr)
	cfgPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		e.Fatal(err)
	}
	cmd := pin.command(pin.caddyCPU, bin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	return startRLSProcess(e, "fleetlimit", cmd, port)
}

// startRLSProcess starts cmd, its output in a log file, stops it at
// cleanup, and waits up to 30 s for a ShouldRateLimit call on port to be
// answered.
func startRLSProcess(e *env, name string, cmd *exec.Cmd, port int) *rlsServer {
	logPath := filepath.Join(e.TempDir(), "service.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		e.Fatal(err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		e.Fatalf("starting %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	e.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	s := &rlsServer{Name: name, Addr: fmt.Sprintf("127.0.0.1:%d", port), PID: cmd.Process.Pid} // taskset execs the service: same process
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: rlsDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: rlsKey, Value: "ready"}}}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK && len(resp.GetStatuses()) == 1 && resp.GetStatuses()[0].GetCurrentLimit() != nil {
			return s
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			e.Fatalf("%s exited before it answered: %s", name, log)
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			e.Fatalf("%s did not answer ShouldRateLimit within 30 s (last: %v): %s", name, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
