// Command bench measures the rate_limit handler against plain Caddy in one
// run: it builds Caddy from cmd/caddy, starts one redis-server, and loads a
// fresh Caddy per configuration and round with wrk, alternating the
// configurations round-robin, then reports medians over the rounds.
//
//	go run ./bench [-rounds 3] [-duration 10s] [-connections 50] [-out bench-results]
//
// Configurations: plain Caddy (respond "ok"), rate_limit on the memory
// store and rate_limit on Redis; each with one hot key and with 100,000
// random keys (header X-Key; the zone keys on {header.X-Key}), with a limit
// nothing reaches, plus the memory store on the random keys with `headers
// none` (the handler's own cost, without writing five more response
// fields), a hot key on which most requests are denied, and a light-load
// pass (-latency-connections) for latency without queueing.
//
// It writes results.md, chart.svg and results.json into -out and prints the
// table. It needs wrk and redis-server on PATH; all traffic stays on
// 127.0.0.1. Then it takes a CPU profile of Caddy in the configurations
// -profile names (default: Redis, 100k keys) through Caddy's admin endpoint.
//
// The machine may be shared: before each run it waits for the CPUs to be
// quiet, and it repeats a run in which other processes took more than
// -max-foreign percent of Caddy's CPU or of the load's.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/fleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The rules. Allow: one token refills every 3.6 s, so that every bucket
// lives in Redis for the whole run (its TTL is the time to refill), and the
// burst is far above what a run can spend. Deny: 100 per second on a key
// that gets thousands.
const (
	allowRule = "rate 1000 1h\n\t\t\tburst 100000000"
	denyRule  = "rate 100 1s"
)

// scenario is a kind of load; each runs against plain Caddy (except the
// denial scenario, whose reference is plain Caddy of the hot key), the
// memory store and Redis.
type scenario struct {
	ID    string
	Label string
	Keys  int  // 0: one hot key
	Deny  bool // a limit most requests exceed
	Conns int
	Ref   string // ID of the scenario whose plain run is the reference
	Plain bool   // has a plain configuration of its own
	// NoHeaders runs the memory store with `headers none`: the handler's
	// own cost, without the five response fields' cost in net/http.
	NoHeaders bool
}

type config struct {
	Sc    *scenario
	Store string // plain, memory, redis
}

func (c config) Name() string {
	return c.Store + ", " + c.Sc.Label
}

// sample is one measured run of one configuration.
type sample struct {
	Round    int
	Wrk      wrkResult
	RSSKB    int64
	CaddyCPU time.Duration
	Redis    *redisSample `json:",omitempty"`
	// FailWarnings and FailTotal are the limiter's store failure
	// warnings in Caddy's log (at most one a second) during the measured
	// load, and the largest failure count (since Caddy started) they
	// reported; FailError is the first one's error. WarmupFailures counts
	// the warnings during start-up and warm-up.
	FailWarnings   int
	FailTotal      int64
	FailError      string `json:",omitempty"`
	WarmupFailures int
	// StealPct is the CPU time stolen by the hypervisor from Caddy's CPU
	// (from all CPUs when not pinned) during the measured load.
	StealPct float64
	// ForeignCaddy and ForeignLoad are the percent of Caddy's CPU and of
	// the load CPU that other processes used during the measured load;
	// Foreign is the larger. Attempts counts the runs it took to get one
	// with Foreign at most -max-foreign (the least disturbed one is kept).
	ForeignCaddy float64
	ForeignLoad  float64
	Foreign      float64
	Attempts     int
	// Ratio is requests/s over the reference plain run of the same round;
	// CPURatio is the reference's Caddy CPU time per request over this
	// run's (the throughput ratio if Caddy's CPU were all that counted);
	// P99Added is the p99 latency over the reference's.
	Ratio    float64
	CPURatio float64
	P99Added time.Duration
}

type redisSample struct {
	Calls, Usec, Reads int64
	// Decisions counts the decisions sent to Redis: Caddy's
	// caddy_rate_limit_store_duration_seconds count (the decisions waiting
	// together share an EVALSHA).
	Decisions int64
	CPU       float64 // seconds
	// Other counts the other commands run, those inside scripts included
	// (OtherNames: which, and how many).
	Other            int64
	OtherNames       []string `json:",omitempty"`
	MemDelta, DBSize int64    // runs with many keys: used_memory delta and keys
	KeyUsage         int64    // MEMORY USAGE of one bucket
	SampleKey        string
}

type bench struct {
	env      *env
	pin      pinning
	bin      string
	script   string
	redis    *redistest.Server
	duration time.Duration
	warmup   time.Duration
	threads  int
	keys     int
	// maxForeign, retries and quietWait: see measure and waitQuiet.
	maxForeign float64
	retries    int
	quietWait  time.Duration
	scenarios  []*scenario
	configs    []config
}

func main() {
	rounds := flag.Int("rounds", 3, "rounds; every configuration runs once per round, round-robin")
	duration := flag.Duration("duration", 10*time.Second, "measured load per configuration and round")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured load before each measurement")
	conns := flag.Int("connections", 50, "wrk connections")
	latConns := flag.Int("latency-connections", 1, "connections of the light-load pass (0: skip it)")
	keys := flag.Int("keys", 100000, "distinct keys of the random-key configurations")
	threads := flag.Int("threads", 0, "wrk threads (0: one per CPU wrk may use)")
	out := flag.String("out", "bench-results", "directory for results.md, chart.svg, results.json")
	pin := flag.Bool("pin", true, "pin Caddy and the load (wrk, redis-server) to separate CPUs with taskset")
	maxForeign := flag.Float64("max-foreign", 10, "repeat a run in which other processes used more than this percent of a benchmark CPU")
	retries := flag.Int("retries", 2, "repeats of a disturbed run at most")
	quietWait := flag.Duration("quiet-wait", 30*time.Second, "wait up to this long before each run for the machine to be quiet")
	only := flag.String("only", "", "run only these configurations, store/scenario separated by commas (e.g. plain/keys,redis/keys); default all")
	profile := flag.String("profile", "redis/keys", "after the rounds, take a 10s CPU profile of Caddy in these configurations, store/scenario separated by commas (scenarios: hot, keys, bare, deny, light); empty: none")
	flag.Parse()
	if *rounds < 1 || *conns < 1 || *duration < time.Second {
		fmt.Fprintln(os.Stderr, "bench: need -rounds >= 1, -connections >= 1, -duration >= 1s")
		os.Exit(2)
	}

	e := newEnv()
	defer e.close()
	b := &bench{env: e, pin: choosePinning(!*pin), duration: *duration, warmup: *warmup, keys: *keys}
	b.threads = *threads
	b.maxForeign, b.retries, b.quietWait = *maxForeign, max(*retries, 0), *quietWait
	if b.threads <= 0 {
		b.threads = 1
		if !b.pin.on() {
			b.threads = max(1, len(allowedCPUs())/2)
		}
	}
	m := describeMachine()
	fmt.Fprintf(os.Stderr, "machine: %d CPUs (nproc %s), %s, %s, kernel %s, load average %s\n", m.NumCPU, m.Allowed, m.CPUModel, m.GoVersion, m.Kernel, m.LoadAvg)
	fmt.Fprintf(os.Stderr, "pinning: %s\n", b.pin)

	kl := fmt.Sprintf("%dk keys", *keys/1000)
	if *keys%1000 != 0 {
		kl = fmt.Sprintf("%d keys", *keys)
	}
	b.scenarios = []*scenario{
		{ID: "hot", Label: "hot key", Conns: *conns, Ref: "hot", Plain: true},
		{ID: "keys", Label: kl, Keys: *keys, Conns: *conns, Ref: "keys", Plain: true},
		{ID: "bare", Label: kl + ", headers none", Keys: *keys, Conns: *conns, Ref: "keys", NoHeaders: true},
		{ID: "deny", Label: "hot key, most denied", Deny: true, Conns: *conns, Ref: "hot"},
	}
	if *latConns > 0 {
		b.scenarios = append(b.scenarios, &scenario{ID: "light", Label: fmt.Sprintf("%s, %d conn", kl, *latConns), Keys: *keys, Conns: *latConns, Ref: "light", Plain: true})
	}
	want := map[string]bool{}
	for spec := range strings.SplitSeq(*only, ",") {
		if spec = strings.TrimSpace(spec); spec != "" {
			want[spec] = true
		}
	}
	for _, sc := range b.scenarios {
		for _, st := range []string{"plain", "memory", "redis"} {
			if st == "plain" && !sc.Plain || st == "redis" && sc.NoHeaders {
				continue
			}
			if len(want) > 0 && !want[st+"/"+sc.ID] {
				continue
			}
			b.configs = append(b.configs, config{Sc: sc, Store: st})
		}
	}
	if len(b.configs) == 0 {
		e.Fatalf("-only %q matches no configuration", *only)
	}

	fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
	bin, err := fleet.BuildCaddy(e.TempDir())
	if err != nil {
		e.Fatal(err)
	}
	b.bin = bin
	if b.script, err = writeWrkScript(e.TempDir()); err != nil {
		e.Fatal(err)
	}
	b.redis = redistest.Start(e)
	if pid, err := redisPID(b.redis); err != nil || pid == 0 {
		e.Fatalf("redis process id: %v", err)
	} else if err := b.pin.pinPID(b.pin.loadCPU, pid); err != nil {
		e.Fatal(err)
	}
	per := b.warmup + b.duration + 3*time.Second
	fmt.Fprintf(os.Stderr, "redis on %s; %d configurations x %d rounds, about %s\n", b.redis.Addr, len(b.configs), *rounds, (time.Duration(len(b.configs)**rounds) * per).Round(time.Second))

	samples := make(map[string][]*sample)
	for round := 1; round <= *rounds; round++ {
		got := make(map[string]*sample)
		for _, c := range b.configs {
			s := b.measure(c, round)
			got[c.Name()] = s
			samples[c.Name()] = append(samples[c.Name()], s)
		}
		for _, c := range b.configs {
			s := got[c.Name()]
			ref := got[config{Sc: b.scenario(c.Sc.Ref), Store: "plain"}.Name()]
			if ref != nil && ref.Wrk.RPS() > 0 {
				s.Ratio = s.Wrk.RPS() / ref.Wrk.RPS()
				if s.CaddyCPU > 0 && s.Wrk.Requests > 0 {
					s.CPURatio = (ref.CaddyCPU.Seconds() / float64(ref.Wrk.Requests)) / (s.CaddyCPU.Seconds() / float64(s.Wrk.Requests))
				}
				s.P99Added = s.Wrk.P99 - ref.Wrk.P99
			}
		}
	}

	var profs []*profileResult
	for spec := range strings.SplitSeq(*profile, ",") {
		if spec = strings.TrimSpace(spec); spec == "" {
			continue
		}
		st, id, _ := strings.Cut(spec, "/")
		sc := b.scenario(id)
		if sc == nil || (st != "plain" && st != "memory" && st != "redis") || (st == "plain" && !sc.Plain) {
			fmt.Fprintf(os.Stderr, "bench: -profile: no configuration %q\n", spec)
			continue
		}
		if p := b.profile(config{Sc: sc, Store: st}, *out); p != nil {
			profs = append(profs, p)
		}
	}

	rep := &report{Machine: m, Pinning: b.pin.String(), Args: strings.Join(os.Args[1:], " "), Rounds: *rounds,
		Duration: b.duration, Warmup: b.warmup, Threads: b.threads, MaxForeign: b.maxForeign, Retries: b.retries, Configs: b.configs, Samples: samples,
		Profiles: profs}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		e.Fatal(err)
	}
	md := rep.markdown()
	if err := os.WriteFile(filepath.Join(*out, "results.md"), []byte(md), 0o644); err != nil {
		e.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*out, "chart.svg"), []byte(rep.svg()), 0o644); err != nil {
		e.Fatal(err)
	}
	if err := rep.writeJSON(filepath.Join(*out, "results.json")); err != nil {
		e.Fatal(err)
	}
	fmt.Println(rep.summary())
	fmt.Printf("Wrote %s, %s and %s.\n", filepath.Join(*out, "results.md"), filepath.Join(*out, "chart.svg"), filepath.Join(*out, "results.json"))
}

func (b *bench) scenario(id string) *scenario {
	for _, sc := range b.scenarios {
		if sc.ID == id {
			return sc
		}
	}
	return nil
}

// site is the site block of a configuration.
func (b *bench) site(c config) string {
	if c.Store == "plain" {
		return "\trespond \"ok\""
	}
	redis := ""
	if c.Store == "redis" {
		redis = fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t}", b.redis.Addr)
	}
	rule := allowRule
	if c.Sc.Deny {
		rule = denyRule
	}
	if c.Sc.NoHeaders {
		redis += "\n\t\theaders none"
	}
	return fmt.Sprintf(`	rate_limit {
		%s
		zone bench {
			key {header.X-Key}
			%s
		}
	}
	respond "ok"`, redis, rule)
}

// measure runs a configuration until it gets a run that nothing else on
// the machine disturbed (other processes' CPU on the CPUs of the benchmark
// at most -max-foreign percent), or -retries runs more, and keeps the
// least disturbed run.
func (b *bench) measure(c config, round int) *sample {
	var best *sample
	attempts := 0
	defer func() { best.Attempts = attempts }()
	for attempt := 0; attempt <= b.retries; attempt++ {
		b.waitQuiet()
		s := b.runOne(c, round)
		attempts++
		if best == nil || s.Foreign < best.Foreign {
			best = s
		}
		if s.Foreign <= b.maxForeign {
			break
		}
		if attempt < b.retries {
			fmt.Fprintf(os.Stderr, "         disturbed: other processes used %.0f%% of a benchmark CPU; running it again\n", s.Foreign)
		}
	}
	if best.Foreign > b.maxForeign {
		fmt.Fprintf(os.Stderr, "         kept the least disturbed run (%.0f%% foreign CPU) of %d\n", best.Foreign, attempts)
	}
	return best
}

// waitQuiet waits, up to -quiet-wait, until the machine's CPUs are busy
// at most -max-foreign percent over one second (nothing of the benchmark
// runs at this point but an idle redis-server).
func (b *bench) waitQuiet() {
	deadline := time.Now().Add(b.quietWait)
	waited := false
	for {
		a, err := readCPUStat("")
		if err != nil {
			return
		}
		time.Sleep(time.Second)
		z, err := readCPUStat("")
		if err != nil {
			return
		}
		busy := busyPct(a, z)
		if busy <= b.maxForeign {
			if waited {
				fmt.Fprintf(os.Stderr, "         (waited for other processes; machine now %.0f%% busy)\n", busy)
			}
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "         (machine still %.0f%% busy after waiting %s; going on)\n", busy, b.quietWait)
			return
		}
		waited = true
	}
}

// runOne measures one configuration once, on a fresh Caddy (and, for
// Redis, an empty database).
func (b *bench) runOne(c config, round int) *sample {
	e := b.env
	s := &sample{Round: round}
	var memBefore int64
	if c.Store == "redis" {
		b.redis.MustDo("FLUSHALL")
		in, err := readRedisInfo(b.redis)
		if err != nil {
			e.Fatal(err)
		}
		memBefore = in.UsedMemory
	}
	// Redis runs have the admin endpoint on, for the decisions Caddy's
	// metrics count; an idle endpoint costs the requests nothing.
	proc := startCaddy(e, b.pin, b.bin, b.site(c), c.Store == "redis")
	if b.warmup > 0 {
		if _, err := runWrk(b.pin, b.script, proc.URL, b.threads, c.Sc.Conns, c.Sc.Keys, b.warmup); err != nil {
			e.Fatal(err)
		}
	}
	var before redisInfo
	var err error
	if before, err = readRedisInfo(b.redis); err != nil {
		e.Fatal(err)
	}
	var decided0 int64
	if c.Store == "redis" {
		b.redis.MustDo("CONFIG", "RESETSTAT")
		if before, err = readRedisInfo(b.redis); err != nil {
			e.Fatal(err)
		}
		if decided0, err = storeDecisions(proc.Admin); err != nil {
			e.Fatal(err)
		}
	}
	logAt := proc.logSize()
	cpu0, err := cpuTime(proc.PID)
	if err != nil {
		e.Fatal(err)
	}
	statC0, err1 := readCPUStat(b.pin.caddyCPU)
	statL0, err2 := readCPUStat(b.pin.loadCPU)
	if err := errors.Join(err1, err2); err != nil {
		e.Fatal(err)
	}
	w, err := runWrk(b.pin, b.script, proc.URL, b.threads, c.Sc.Conns, c.Sc.Keys, b.duration)
	if err != nil {
		e.Fatal(err)
	}
	cpu1, err := cpuTime(proc.PID)
	if err != nil {
		e.Fatal(err)
	}
	statC1, err1 := readCPUStat(b.pin.caddyCPU)
	statL1, err2 := readCPUStat(b.pin.loadCPU)
	if err := errors.Join(err1, err2); err != nil {
		e.Fatal(err)
	}
	s.Wrk, s.CaddyCPU = w, cpu1-cpu0
	if s.RSSKB, err = procStatusKB(proc.PID, "VmHWM"); err != nil {
		e.Fatal(err)
	}
	after, err := readRedisInfo(b.redis)
	if err != nil {
		e.Fatal(err)
	}
	var decided1 int64
	if c.Store == "redis" {
		if decided1, err = storeDecisions(proc.Admin); err != nil {
			e.Fatal(err)
		}
	}
	redisCPU := time.Duration((after.CPU - before.CPU) * float64(time.Second))
	if c.Store == "redis" {
		s.Redis = &redisSample{
			Calls:     after.EvalshaCalls - before.EvalshaCalls,
			Usec:      after.EvalshaUsec - before.EvalshaUsec,
			Reads:     after.Reads - before.Reads,
			CPU:       after.CPU - before.CPU,
			Other:     after.OtherCalls - before.OtherCalls,
			Decisions: decided1 - decided0,
		}
		for name, n := range after.Other {
			if d := n - before.Other[name]; d > 0 {
				s.Redis.OtherNames = append(s.Redis.OtherNames, fmt.Sprintf("%s %d", name, d))
			}
		}
		sort.Strings(s.Redis.OtherNames)
	}
	// Other processes' CPU time on the benchmark's CPUs: each CPU's busy
	// time less what Caddy, wrk and Redis used there.
	s.StealPct = stealPct(statC0, statC1)
	if b.pin.on() {
		s.ForeignCaddy = busyPct(statC0, statC1) - 100*s.CaddyCPU.Seconds()/window(statC0, statC1)
		s.ForeignLoad = busyPct(statL0, statL1) - 100*(w.CPU+redisCPU).Seconds()/window(statL0, statL1)
	} else {
		// The line of all CPUs: its window is the wall time times the CPUs.
		s.ForeignCaddy = busyPct(statC0, statC1) - 100*(s.CaddyCPU+w.CPU+redisCPU).Seconds()/window(statC0, statC1)
		s.ForeignLoad = s.ForeignCaddy
	}
	s.Foreign = max(s.ForeignCaddy, s.ForeignLoad, 0)

	proc.Stop() // closes Caddy's Redis connections, whose buffers would count as used memory
	s.FailWarnings, s.FailTotal, s.FailError = proc.storeFailures(logAt)
	var warmupErr string
	s.WarmupFailures, _, warmupErr = proc.storeFailures(0)
	s.WarmupFailures -= s.FailWarnings
	if c.Store == "redis" && c.Sc.Keys > 0 {
		in, err := readRedisInfo(b.redis)
		if err != nil {
			e.Fatal(err)
		}
		s.Redis.MemDelta = in.UsedMemory - memBefore
		if s.Redis.DBSize, err = redisInt(b.redis, "DBSIZE"); err != nil {
			e.Fatal(err)
		}
		if key, err := b.redis.Do("RANDOMKEY"); err == nil && key != "(nil)" {
			s.Redis.SampleKey = key
			s.Redis.KeyUsage, _ = redisInt(b.redis, "MEMORY", "USAGE", key, "SAMPLES", "0")
		}
	}
	fmt.Fprintf(os.Stderr, "round %d  %-32s %7.0f req/s  p50 %6.3f  p99 %6.3f  p99.9 %6.3f ms  non-2xx %5.1f%%  caddy %5.1f us/req  rss %5.1f MiB  foreign %3.0f%%/%3.0f%%  steal %3.1f%%%s\n",
		round, c.Name(), w.RPS(), ms(w.P50), ms(w.P99), ms(w.P999), pct(w.Status, w.Requests),
		us(s.CaddyCPU)/float64(max(w.Requests, 1)), float64(s.RSSKB)/1024, s.ForeignCaddy, s.ForeignLoad, s.StealPct, redisLine(s))
	if w.SockErrors > 0 {
		fmt.Fprintf(os.Stderr, "         warning: %d socket errors or timeouts\n", w.SockErrors)
	}
	if s.WarmupFailures > 0 {
		fmt.Fprintf(os.Stderr, "         note: %d store failure warnings at start-up or warm-up (not measured): %s\n", s.WarmupFailures, warmupErr)
	}
	return s
}

func redisLine(s *sample) string {
	r := s.Redis
	if r == nil {
		return ""
	}
	n := float64(max(s.Wrk.Requests, 1))
	line := fmt.Sprintf("  redis %.2f us/decision, %.1f decisions/evalsha, %.3f evalsha/req, %.3f reads/req", float64(r.Usec)/float64(max(r.Decisions, 1)),
		float64(r.Decisions)/float64(max(r.Calls, 1)), float64(r.Calls)/n, float64(r.Reads)/n)
	if r.Other > 0 {
		line += fmt.Sprintf(", other commands (scripts' own included): %s", strings.Join(r.OtherNames, ", "))
	}
	if r.DBSize > 0 {
		line += fmt.Sprintf(", %d keys, %.1f B/key, MEMORY USAGE %d", r.DBSize, float64(r.MemDelta)/float64(r.DBSize), r.KeyUsage)
	}
	if s.FailWarnings > 0 {
		line += fmt.Sprintf(", STORE FAILURES while measured: %d warnings, total %d (%s)", s.FailWarnings, s.FailTotal, s.FailError)
	}
	return line
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func pct(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}
