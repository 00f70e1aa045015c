// Command bench measures the rate_limit handler against plain Caddy in one
// run: it builds Caddy from cmd/caddy, starts one redis-server, and loads a
// fresh Caddy per configuration and round with wrk, alternating the
// configurations round-robin, then reports medians over the rounds.
//
//	go run ./cmd/bench [-rounds 3] [-duration 10s] [-connections 50] [-out bench-results]
//
// Configurations: plain Caddy (respond "ok"), rate_limit on the memory
// store and rate_limit on Redis; each with one hot key and with 100,000
// random keys (header X-Key; the zone keys on {header.X-Key}), with a limit
// nothing reaches, plus the memory store on the random keys with `headers
// none` (the handler's own cost, without writing five more response
// fields), a hot key on which most requests are denied, a hot key that is
// banned, and a light-load pass (-latency-connections) for latency without
// queueing. Two more plain Caddy configurations are the fair baselines:
// plain Caddy writing the same five rate limit fields with the header
// directive (what the fields cost by themselves), and plain Caddy answering
// `respond 429` with the same fields and Retry-After (what a denial would
// cost if Caddy answered it statically). Every rate_limit row is reported
// against plain Caddy and against its fair baseline.
//
// It writes results.md, chart.svg and results.json into -out and prints the
// table. It needs wrk and redis-server on PATH; all traffic stays on
// 127.0.0.1. Then it takes a CPU profile of Caddy in the configurations
// -profile names (default: Redis, 100k keys) through Caddy's admin endpoint.
//
// The machine may be shared: before each run it waits for the CPUs to be
// quiet, and it repeats a run in which other processes took more than
// -max-foreign percent of Caddy's CPU or of the load's.
//
// With -rls it measures the Envoy rate limit service (rate_limit_rls)
// against the reference, envoyproxy/ratelimit, instead: see runRLS; with
// -rls-hang it times that service's answers while Redis hangs: see
// runRLSHang.
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

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// The rules. Allow: one token refills every 3.6 s, so that every bucket
// lives in Redis for the whole run (its TTL is the time to refill), and the
// burst is far above what a run can spend. Deny: 100 per second on a key
// that gets thousands.
const (
	allowRule = "rate 1000 1h\n\t\t\tburst 100000000"
	denyRule  = "rate 100 1s"
	// banRule bans the hot key for an hour after its tenth denial, which
	// the warm-up reaches: every measured request is answered banned.
	banRule = denyRule + "\n\t\t\tban 1h after 10 in 1m"
)

// The fair baselines' response fields: what rate_limit writes with the
// rules above (the numbers of the same length), set by the header
// directive in front of respond.
var (
	// allowFields are an admitted request's five fields under allowRule.
	allowFields = [][2]string{
		{"RateLimit-Policy", `"bench";q=1000;w=3600`},
		{"RateLimit", `"bench";r=99999999;t=4`},
		{"X-RateLimit-Limit", "1000"},
		{"X-RateLimit-Remaining", "99999999"},
		{"X-RateLimit-Reset", "4"},
	}
	// denyFields are a denied request's fields under denyRule, with
	// Retry-After.
	denyFields = [][2]string{
		{"RateLimit-Policy", `"bench";q=100;w=1`},
		{"RateLimit", `"bench";r=0;t=1`},
		{"X-RateLimit-Limit", "100"},
		{"X-RateLimit-Remaining", "0"},
		{"X-RateLimit-Reset", "1"},
		{"Retry-After", "1"},
	}
)

// scenario is a kind of load; each runs against plain Caddy (the denial
// scenarios' reference is plain Caddy of the hot key), the memory store
// and Redis. A baseline scenario runs plain Caddy only: it is another
// scenario's fair baseline.
type scenario struct {
	ID    string // short name, for -only and -profile
	Label string // name in the reports
	Keys  int    // distinct random keys; 0: one hot key
	Deny  bool   // a limit most requests exceed
	Ban   bool   // and the zone bans the key (banRule)
	Conns int    // wrk connections
	Ref   string // ID of the scenario whose plain run is the reference
	// Fair is the ID of the scenario whose plain run is the fair
	// baseline: plain Caddy sending the same response (fields, status)
	// without the limiter. Empty: the reference.
	Fair  string
	Plain bool // has a plain configuration of its own
	// Baseline: the scenario has only its plain configuration, which
	// writes Fields with the header directive and answers Status.
	Baseline bool
	Fields   [][2]string
	Status   int // 0: 200 "ok"
	// NoHeaders runs the memory store with `headers none`: the handler's
	// own cost, without the five response fields' cost in net/http.
	NoHeaders bool
}

// fair returns the ID of the scenario whose plain run is sc's fair
// baseline.
func (sc *scenario) fair() string {
	if sc.Fair != "" {
		return sc.Fair
	}
	return sc.Ref
}

// config is one configuration measured: a scenario on one store.
type config struct {
	Sc    *scenario
	Store string // plain, memory, redis
}

// Name names the configuration in the reports, and keys its samples.
func (c config) Name() string {
	return c.Store + ", " + c.Sc.Label
}

// sample is one measured run of one configuration.
type sample struct {
	Round int
	Wrk   wrkResult
	RSSKB int64 // Caddy's peak resident set (VmHWM), in KiB
	// CaddyCPU is Caddy's CPU time (user + system) during the measured
	// load.
	CaddyCPU time.Duration
	Redis    *redisSample `json:",omitempty"` // Redis runs only
	// FailWarnings counts the limiter's store failure warnings in Caddy's
	// log (at most one a second) during the measured load.
	FailWarnings int
	// FailTotal is the largest failure count (since Caddy started) those
	// warnings reported.
	FailTotal int64
	// FailError is the first warning's error.
	FailError string `json:",omitempty"`
	// WarmupFailures counts the warnings during start-up and warm-up.
	WarmupFailures int
	// StealPct is the CPU time stolen by the hypervisor from Caddy's CPU
	// (from all CPUs when not pinned) during the measured load, percent.
	StealPct float64
	// ForeignCaddy is the percent of Caddy's CPU that other processes
	// used during the measured load.
	ForeignCaddy float64
	// ForeignLoad is the percent of the load CPU (wrk, Redis) that other
	// processes used.
	ForeignLoad float64
	// Foreign is the larger of ForeignCaddy and ForeignLoad, at least 0.
	Foreign float64
	// Attempts counts the runs it took to get one with Foreign at most
	// -max-foreign (the least disturbed one is kept).
	Attempts int
	// Ratio is requests/s over the reference plain run of the same round.
	Ratio float64
	// CPURatio is the reference's Caddy CPU time per request over this
	// run's (the throughput ratio if Caddy's CPU were all that counted).
	CPURatio float64
	// FairRatio and FairCPURatio are Ratio and CPURatio against the fair
	// baseline's run of the same round (see scenario.Fair).
	FairRatio, FairCPURatio float64
	// P99Added is the p99 latency over the reference's.
	P99Added time.Duration
}

// redisSample is what Redis did during one measured run: deltas of INFO
// between its start and end. MemDelta, DBSize, KeyUsage and SampleKey are
// measured on runs with many keys only.
type redisSample struct {
	Calls int64 // EVALSHA calls
	Usec  int64 // EVALSHA server time, microseconds
	Reads int64 // read events (total_reads_processed): one per round trip
	// Decisions counts the decisions sent to Redis: Caddy's
	// caddy_rate_limit_store_duration_seconds count (the decisions waiting
	// together share an EVALSHA).
	Decisions int64
	CPU       float64 // seconds
	// Other counts the other commands run, those inside scripts included
	// (OtherNames: which, and how many).
	Other      int64
	OtherNames []string `json:",omitempty"`
	MemDelta   int64    // used_memory from the emptied database to the end, bytes
	DBSize     int64    // keys at the end
	KeyUsage   int64    // MEMORY USAGE of SampleKey, bytes
	SampleKey  string   // a random bucket key
}

// bench is one benchmark: its settings and the processes it shares between
// runs.
type bench struct {
	env      *env
	pin      pinning
	bin      string // the Caddy binary
	script   string // the wrk script
	redis    *redistest.Server
	duration time.Duration // measured load per run
	warmup   time.Duration // unmeasured load before it
	threads  int           // wrk threads
	keys     int           // distinct keys of the random-key scenarios
	// maxForeign, retries and quietWait: see measure and waitQuiet.
	maxForeign float64
	retries    int
	quietWait  time.Duration
	scenarios  []*scenario
	configs    []config
}

// options are the command line's flags.
type options struct {
	rounds     int
	duration   time.Duration
	warmup     time.Duration
	conns      int
	latConns   int // connections of the light-load pass; 0: none
	aloneRuns  int // runs of each Redis configuration with Redis alone on a CPU; 0: none
	keys       int
	threads    int // wrk threads; 0: chosen from the CPUs
	out        string
	pin        bool
	maxForeign float64 // percent
	retries    int
	quietWait  time.Duration
	only       string
	profile    string
	caddy      string // a Caddy binary to measure; empty: build cmd/caddy
	rls        bool   // run the RLS comparison instead
	rlsCallers int    // concurrent callers of the RLS load
	rlsRef     string // a reference service_cmd binary; empty: build it from tools
	rlsHang    bool   // time the RLS answers while Redis hangs (runRLSHang) instead
}

func main() {
	o := parseFlags()
	e := newEnv()
	defer e.Close()
	if o.rls {
		runRLS(e, o)
		return
	}
	if o.rlsHang {
		runRLSHang(e, o)
		return
	}
	b := newBench(e, o)
	m := describeMachine()
	fmt.Fprintf(os.Stderr, "machine: %d CPUs (nproc %s), %s, %s, kernel %s, load average %s\n", m.NumCPU, m.Allowed, m.CPUModel, m.GoVersion, m.Kernel, m.LoadAvg)
	fmt.Fprintf(os.Stderr, "pinning: %s\n", b.pin)

	b.scenarios = newScenarios(o)
	b.configs = b.selectConfigs(o.only)
	if len(b.configs) == 0 {
		e.Fatalf("-only %q matches no configuration", o.only)
	}
	b.start()
	per := b.warmup + b.duration + 3*time.Second
	fmt.Fprintf(os.Stderr, "redis on %s; %d configurations x %d rounds, about %s\n", b.redis.Addr, len(b.configs), o.rounds, (time.Duration(len(b.configs)*o.rounds) * per).Round(time.Second))

	samples := b.runRounds(o.rounds)
	alone := b.redisAlone(o.aloneRuns)
	profs := b.profiles(o.profile, o.out)
	rep := &report{Machine: m, Pinning: b.pin.String(), Args: strings.Join(os.Args[1:], " "), Rounds: o.rounds,
		Duration: b.duration, Warmup: b.warmup, Threads: b.threads, MaxForeign: b.maxForeign, Retries: b.retries, Configs: b.configs, Samples: samples,
		RedisAlone: alone, Profiles: profs}
	writeResults(e, rep, o.out)
}

// parseFlags parses the command line; it exits when the flags are invalid.
func parseFlags() options {
	var o options
	flag.IntVar(&o.rounds, "rounds", 3, "rounds; every configuration runs once per round, round-robin")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured load per configuration and round")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load before each measurement")
	flag.IntVar(&o.conns, "connections", 50, "wrk connections")
	flag.IntVar(&o.latConns, "latency-connections", 1, "connections of the light-load pass (0: skip it)")
	flag.IntVar(&o.aloneRuns, "redis-alone-runs", 3, "after the rounds, runs of each admitted Redis configuration with Redis alone on a CPU, for its time per decision (0: skip them)")
	flag.IntVar(&o.keys, "keys", 100000, "distinct keys of the random-key configurations")
	flag.IntVar(&o.threads, "threads", 0, "wrk threads (0: one per CPU wrk may use)")
	flag.StringVar(&o.out, "out", "bench-results", "directory for results.md, chart.svg, results.json")
	flag.BoolVar(&o.pin, "pin", true, "pin Caddy and the load (wrk, redis-server) to separate CPUs with taskset")
	flag.Float64Var(&o.maxForeign, "max-foreign", 10, "repeat a run in which other processes used more than this percent of a benchmark CPU")
	flag.IntVar(&o.retries, "retries", 2, "repeats of a disturbed run at most")
	flag.DurationVar(&o.quietWait, "quiet-wait", 30*time.Second, "wait up to this long before each run for the machine to be quiet")
	flag.StringVar(&o.only, "only", "", "run only these configurations, store/scenario separated by commas (e.g. plain/keys,redis/keys); default all")
	flag.StringVar(&o.caddy, "caddy", "", "measure this Caddy binary (built with the module, e.g. from another commit's cmd/caddy, to compare two versions in the same hour) instead of building cmd/caddy")
	flag.StringVar(&o.profile, "profile", "redis/keys", "after the rounds, take a 10s CPU profile of Caddy in these configurations, store/scenario separated by commas (scenarios: hot, keys, fields, bare, 429, deny, ban, light); empty: none")
	flag.BoolVar(&o.rls, "rls", false, "measure the Envoy RLS service (rate_limit_rls) against the reference, envoyproxy/ratelimit, instead of the HTTP handler (uses -rounds, -duration, -warmup, -keys, -pin, -caddy)")
	flag.IntVar(&o.rlsCallers, "rls-callers", 32, "with -rls: closed-loop callers, each with one call in flight")
	flag.BoolVar(&o.rlsHang, "rls-hang", false, "time the Envoy RLS service's answers while Redis hangs (SIGSTOP), per on_error policy, instead (uses -duration, -warmup, -rls-callers, -caddy)")
	flag.StringVar(&o.rlsRef, "rls-reference", "", "with -rls: the reference's service_cmd binary; empty: build it from the tools module")
	flag.Parse()
	if o.rounds < 1 || o.conns < 1 || o.duration < time.Second {
		fmt.Fprintln(os.Stderr, "bench: need -rounds >= 1, -connections >= 1, -duration >= 1s")
		os.Exit(2)
	}
	return o
}

// newBench returns the benchmark of the flags, its CPUs chosen.
func newBench(e *env, o options) *bench {
	b := &bench{env: e, pin: choosePinning(!o.pin), duration: o.duration, warmup: o.warmup, keys: o.keys, bin: o.caddy}
	b.threads = o.threads
	b.maxForeign, b.retries, b.quietWait = o.maxForeign, max(o.retries, 0), o.quietWait
	if b.threads <= 0 {
		b.threads = 1
		if !b.pin.on() {
			b.threads = max(1, len(allowedCPUs())/2)
		}
	}
	return b
}

// newScenarios returns the scenarios of the flags, in the order they run.
func newScenarios(o options) []*scenario {
	kl := fmt.Sprintf("%dk keys", o.keys/1000)
	if o.keys%1000 != 0 {
		kl = fmt.Sprintf("%d keys", o.keys)
	}
	scs := []*scenario{
		{ID: "hot", Label: "hot key", Conns: o.conns, Ref: "hot", Fair: "fields", Plain: true},
		{ID: "keys", Label: kl, Keys: o.keys, Conns: o.conns, Ref: "keys", Fair: "fields", Plain: true},
		{ID: "fields", Label: kl + ", rate limit fields", Keys: o.keys, Conns: o.conns, Ref: "keys", Plain: true,
			Baseline: true, Fields: allowFields},
		{ID: "bare", Label: kl + ", headers none", Keys: o.keys, Conns: o.conns, Ref: "keys", NoHeaders: true},
		{ID: "429", Label: "hot key, static 429", Conns: o.conns, Ref: "hot", Plain: true,
			Baseline: true, Fields: denyFields, Status: 429},
		{ID: "deny", Label: "hot key, most denied", Deny: true, Conns: o.conns, Ref: "hot", Fair: "429"},
		{ID: "ban", Label: "hot key, banned", Deny: true, Ban: true, Conns: o.conns, Ref: "hot", Fair: "429"},
	}
	if o.latConns > 0 {
		scs = append(scs, &scenario{ID: "light", Label: fmt.Sprintf("%s, %d conn", kl, o.latConns), Keys: o.keys, Conns: o.latConns, Ref: "light", Plain: true})
	}
	return scs
}

// selectConfigs returns the configurations of the scenarios that -only
// names (store/scenario separated by commas; empty: all).
func (b *bench) selectConfigs(only string) []config {
	want := map[string]bool{}
	for spec := range strings.SplitSeq(only, ",") {
		if spec = strings.TrimSpace(spec); spec != "" {
			want[spec] = true
		}
	}
	var configs []config
	for _, sc := range b.scenarios {
		for _, st := range []string{"plain", "memory", "redis"} {
			if st == "plain" && !sc.Plain || st != "plain" && sc.Baseline || st == "redis" && sc.NoHeaders {
				continue
			}
			if len(want) > 0 && !want[st+"/"+sc.ID] {
				continue
			}
			configs = append(configs, config{Sc: sc, Store: st})
		}
	}
	return configs
}

// start builds Caddy (unless -caddy named a binary), writes the wrk script
// and starts redis-server on the load CPU.
func (b *bench) start() {
	e := b.env
	var err error
	if b.bin == "" {
		fmt.Fprintln(os.Stderr, "building caddy from cmd/caddy ...")
		if b.bin, err = localfleet.BuildCaddy(e.TempDir()); err != nil {
			e.Fatal(err)
		}
	} else if b.bin, err = filepath.Abs(b.bin); err != nil {
		e.Fatal(err)
	}
	if b.script, err = writeWrkScript(e.TempDir()); err != nil {
		e.Fatal(err)
	}
	b.redis = redistest.Start(e)
	if pid, err := redisPID(b.redis); err != nil || pid == 0 {
		e.Fatalf("redis process id: %v", err)
	} else if err := b.pin.pinPID(b.pin.loadCPU, pid); err != nil {
		e.Fatal(err)
	}
}

// runRounds measures every configuration once per round, round-robin, and
// returns the samples by configuration name, in round order.
func (b *bench) runRounds(rounds int) map[string][]*sample {
	samples := make(map[string][]*sample)
	for round := 1; round <= rounds; round++ {
		got := make(map[string]*sample)
		for _, c := range b.configs {
			s := b.measure(c, round)
			got[c.Name()] = s
			samples[c.Name()] = append(samples[c.Name()], s)
		}
		b.compare(got)
	}
	return samples
}

// compare sets each sample of one round against the reference plain run of
// its scenario, and against its fair baseline, in the same round.
func (b *bench) compare(got map[string]*sample) {
	for _, c := range b.configs {
		s := got[c.Name()]
		if ref := got[config{Sc: b.scenario(c.Sc.Ref), Store: "plain"}.Name()]; ref != nil && ref != s {
			s.Ratio, s.CPURatio = ratios(s, ref)
			if s.Ratio > 0 {
				s.P99Added = s.Wrk.P99 - ref.Wrk.P99
			}
		}
		if fair := got[config{Sc: b.scenario(c.Sc.fair()), Store: "plain"}.Name()]; fair != nil && fair != s && c.Store != "plain" {
			s.FairRatio, s.FairCPURatio = ratios(s, fair)
		}
	}
}

// ratios returns s's requests per second over ref's, and ref's Caddy CPU
// time per request over s's (0 when unknown).
func ratios(s, ref *sample) (rps, cpu float64) {
	if ref.Wrk.RPS() <= 0 {
		return 0, 0
	}
	rps = s.Wrk.RPS() / ref.Wrk.RPS()
	if s.CaddyCPU > 0 && s.Wrk.Requests > 0 && ref.Wrk.Requests > 0 {
		cpu = (ref.CaddyCPU.Seconds() / float64(ref.Wrk.Requests)) / (s.CaddyCPU.Seconds() / float64(s.Wrk.Requests))
	}
	return rps, cpu
}

// profiles takes a CPU profile of each configuration -profile names
// (store/scenario separated by commas), into the directory out.
func (b *bench) profiles(specs, out string) []*profileResult {
	var profs []*profileResult
	for spec := range strings.SplitSeq(specs, ",") {
		if spec = strings.TrimSpace(spec); spec == "" {
			continue
		}
		st, id, _ := strings.Cut(spec, "/")
		sc := b.scenario(id)
		if sc == nil || (st != "plain" && st != "memory" && st != "redis") || (st == "plain" && !sc.Plain) || (st != "plain" && sc.Baseline) {
			fmt.Fprintf(os.Stderr, "bench: -profile: no configuration %q\n", spec)
			continue
		}
		if p := b.profile(config{Sc: sc, Store: st}, out); p != nil {
			profs = append(profs, p)
		}
	}
	return profs
}

// writeResults writes results.md, chart.svg and results.json into the
// directory out, and prints the summary.
func writeResults(e *env, rep *report, out string) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		e.Fatal(err)
	}
	md := rep.markdown()
	if err := os.WriteFile(filepath.Join(out, "results.md"), []byte(md), 0o644); err != nil {
		e.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "chart.svg"), []byte(rep.svg()), 0o644); err != nil {
		e.Fatal(err)
	}
	if err := rep.writeJSON(filepath.Join(out, "results.json")); err != nil {
		e.Fatal(err)
	}
	fmt.Println(rep.summary())
	fmt.Printf("Wrote %s, %s and %s.\n", filepath.Join(out, "results.md"), filepath.Join(out, "chart.svg"), filepath.Join(out, "results.json"))
}

// scenario returns the scenario of an ID, or nil.
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
		return plainSite(c.Sc.Fields, c.Sc.Status)
	}
	redis := ""
	if c.Store == "redis" {
		redis = fmt.Sprintf("redis {\n\t\t\taddress %s\n\t\t}", b.redis.Addr)
	}
	rule := allowRule
	switch {
	case c.Sc.Ban:
		rule = banRule
	case c.Sc.Deny:
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

// plainSite is plain Caddy's site block: respond "ok", or the status, with
// the fields set by the header directive (backquoted: the values hold
// double quotes).
func plainSite(fields [][2]string, status int) string {
	var b strings.Builder
	if len(fields) > 0 {
		b.WriteString("\theader {\n")
		for _, f := range fields {
			fmt.Fprintf(&b, "\t\t%s `%s`\n", f[0], f[1])
		}
		b.WriteString("\t}\n")
	}
	if status != 0 {
		fmt.Fprintf(&b, "\trespond %d", status)
	} else {
		b.WriteString("\trespond \"ok\"")
	}
	return b.String()
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
	onRedis := c.Store == "redis"
	var memBefore int64
	if onRedis {
		memBefore = b.flushRedis()
	}
	// Redis runs have the admin endpoint on, for the decisions Caddy's
	// metrics count; an idle endpoint costs the requests nothing.
	proc := startCaddy(e, b.pin, b.bin, b.site(c), onRedis)
	if b.warmup > 0 {
		if _, err := runWrk(b.pin, b.script, proc.URL, b.threads, c.Sc.Conns, c.Sc.Keys, b.warmup); err != nil {
			e.Fatal(err)
		}
	}
	before, decided0 := b.redisBefore(proc, onRedis)
	logAt := proc.logSize()
	cpu0 := b.readCPU(proc)
	w, err := runWrk(b.pin, b.script, proc.URL, b.threads, c.Sc.Conns, c.Sc.Keys, b.duration)
	if err != nil {
		e.Fatal(err)
	}
	cpu1 := b.readCPU(proc)
	s.Wrk, s.CaddyCPU = w, cpu1.caddy-cpu0.caddy
	if s.RSSKB, err = procStatusKB(proc.PID, "VmHWM"); err != nil {
		e.Fatal(err)
	}
	after, decided1 := b.redisAfter(proc, onRedis)
	redisCPU := time.Duration((after.CPU - before.CPU) * float64(time.Second))
	if onRedis {
		s.Redis = redisDelta(before, after, decided1-decided0)
	}
	s.setForeign(b.pin, cpu0, cpu1, w.CPU+redisCPU)

	proc.Stop() // closes Caddy's Redis connections, whose buffers would count as used memory
	s.FailWarnings, s.FailTotal, s.FailError = proc.storeFailures(logAt)
	var warmupErr string
	s.WarmupFailures, _, warmupErr = proc.storeFailures(0)
	s.WarmupFailures -= s.FailWarnings
	if onRedis && c.Sc.Keys > 0 {
		b.readRedisMemory(s.Redis, memBefore)
	}
	printRun(c, s, warmupErr)
	return s
}

// flushRedis empties Redis and returns its used_memory then, in bytes.
func (b *bench) flushRedis() int64 {
	b.redis.MustDo("FLUSHALL")
	in, err := readRedisInfo(b.redis)
	if err != nil {
		b.env.Fatal(err)
	}
	return in.UsedMemory
}

// redisBefore reads Redis' counters before the measured load. On a Redis
// run it resets them first (CONFIG RESETSTAT), and also returns how many
// decisions proc has sent to Redis.
func (b *bench) redisBefore(proc *caddyProc, onRedis bool) (redisInfo, int64) {
	e := b.env
	before, err := readRedisInfo(b.redis)
	if err != nil {
		e.Fatal(err)
	}
	if !onRedis {
		return before, 0
	}
	b.redis.MustDo("CONFIG", "RESETSTAT")
	if before, err = readRedisInfo(b.redis); err != nil {
		e.Fatal(err)
	}
	decided, err := storeDecisions(proc.Admin)
	if err != nil {
		e.Fatal(err)
	}
	return before, decided
}

// redisAfter reads Redis' counters after the measured load and, on a Redis
// run, how many decisions proc has sent to Redis.
func (b *bench) redisAfter(proc *caddyProc, onRedis bool) (redisInfo, int64) {
	after, err := readRedisInfo(b.redis)
	if err != nil {
		b.env.Fatal(err)
	}
	if !onRedis {
		return after, 0
	}
	decided, err := storeDecisions(proc.Admin)
	if err != nil {
		b.env.Fatal(err)
	}
	return after, decided
}

// redisDelta is what Redis did between two readings, in which Caddy sent
// it decided decisions.
func redisDelta(before, after redisInfo, decided int64) *redisSample {
	r := &redisSample{
		Calls:     after.EvalshaCalls - before.EvalshaCalls,
		Usec:      after.EvalshaUsec - before.EvalshaUsec,
		Reads:     after.Reads - before.Reads,
		CPU:       after.CPU - before.CPU,
		Other:     after.OtherCalls - before.OtherCalls,
		Decisions: decided,
	}
	for name, n := range after.Other {
		if d := n - before.Other[name]; d > 0 {
			r.OtherNames = append(r.OtherNames, fmt.Sprintf("%s %d", name, d))
		}
	}
	sort.Strings(r.OtherNames)
	return r
}

// cpuReading is what runOne reads of the CPUs on each side of the measured
// load.
type cpuReading struct {
	caddy     time.Duration // Caddy's CPU time (user + system)
	caddyStat cpuStat       // Caddy's CPU (all CPUs when not pinned)
	loadStat  cpuStat       // the load CPU (all CPUs when not pinned)
}

// readCPU reads Caddy's CPU time and the benchmark's CPUs' lines of
// /proc/stat.
func (b *bench) readCPU(proc *caddyProc) cpuReading {
	cpu, err := cpuTime(proc.PID)
	if err != nil {
		b.env.Fatal(err)
	}
	statC, err1 := readCPUStat(b.pin.caddyCPU)
	statL, err2 := readCPUStat(b.pin.loadCPU)
	if err := errors.Join(err1, err2); err != nil {
		b.env.Fatal(err)
	}
	return cpuReading{caddy: cpu, caddyStat: statC, loadStat: statL}
}

// setForeign sets the steal and the other processes' CPU time on the
// benchmark's CPUs between two readings: each CPU's busy time less what
// Caddy (s.CaddyCPU) and the load (loadCPU: wrk and Redis) used there.
func (s *sample) setForeign(pin pinning, r0, r1 cpuReading, loadCPU time.Duration) {
	s.StealPct = stealPct(r0.caddyStat, r1.caddyStat)
	if pin.on() {
		s.ForeignCaddy = busyPct(r0.caddyStat, r1.caddyStat) - 100*s.CaddyCPU.Seconds()/window(r0.caddyStat, r1.caddyStat)
		s.ForeignLoad = busyPct(r0.loadStat, r1.loadStat) - 100*loadCPU.Seconds()/window(r0.loadStat, r1.loadStat)
	} else {
		// The line of all CPUs: its window is the wall time times the CPUs.
		s.ForeignCaddy = busyPct(r0.caddyStat, r1.caddyStat) - 100*(s.CaddyCPU+loadCPU).Seconds()/window(r0.caddyStat, r1.caddyStat)
		s.ForeignLoad = s.ForeignCaddy
	}
	s.Foreign = max(s.ForeignCaddy, s.ForeignLoad, 0)
}

// readRedisMemory sets what the buckets of a run with many keys take in
// Redis: the used_memory delta since memBefore (bytes), the keys, and
// MEMORY USAGE of one at random.
func (b *bench) readRedisMemory(r *redisSample, memBefore int64) {
	e := b.env
	in, err := readRedisInfo(b.redis)
	if err != nil {
		e.Fatal(err)
	}
	r.MemDelta = in.UsedMemory - memBefore
	if r.DBSize, err = redisInt(b.redis, "DBSIZE"); err != nil {
		e.Fatal(err)
	}
	if key, err := b.redis.Do("RANDOMKEY"); err == nil && key != "(nil)" {
		r.SampleKey = key
		r.KeyUsage, _ = redisInt(b.redis, "MEMORY", "USAGE", key, "SAMPLES", "0")
	}
}

// printRun prints a run's line, and its warnings, to standard error.
func printRun(c config, s *sample, warmupErr string) {
	w := s.Wrk
	fmt.Fprintf(os.Stderr, "round %d  %-32s %7.0f req/s  p50 %6.3f  p99 %6.3f  p99.9 %6.3f ms  non-2xx %5.1f%%  caddy %5.1f us/req  rss %5.1f MiB  foreign %3.0f%%/%3.0f%%  steal %3.1f%%%s\n",
		s.Round, c.Name(), w.RPS(), ms(w.P50), ms(w.P99), ms(w.P999), pct(w.Status, w.Requests),
		us(s.CaddyCPU)/float64(max(w.Requests, 1)), float64(s.RSSKB)/1024, s.ForeignCaddy, s.ForeignLoad, s.StealPct, redisLine(s))
	if w.SockErrors > 0 {
		fmt.Fprintf(os.Stderr, "         warning: %d socket errors or timeouts\n", w.SockErrors)
	}
	if s.WarmupFailures > 0 {
		fmt.Fprintf(os.Stderr, "         note: %d store failure warnings at start-up or warm-up (not measured): %s\n", s.WarmupFailures, warmupErr)
	}
}

// redisLine is the Redis part of a run's line: per decision and per
// request figures, memory, and store failures.
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
