package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Topology is where the fleet's buckets live.
type Topology string

// The topologies a scenario is drawn on.
const (
	Single   Topology = "single"   // one redis-server
	Cluster  Topology = "cluster"  // a Redis Cluster of three masters
	Sentinel Topology = "sentinel" // a master, a replica and three sentinels
	Memory   Topology = "memory"   // the in-process store of one node
)

// The algorithms a zone is drawn with.
const (
	TokenBucket   = "token_bucket"
	SlidingWindow = "sliding_window"
	FixedWindow   = "fixed_window"
	SlidingLog    = "sliding_log"
	LeakyBucket   = "leaky_bucket"
	Concurrency   = "concurrency"
)

var algorithms = []string{TokenBucket, SlidingWindow, FixedWindow, SlidingLog, LeakyBucket, Concurrency}

// Tier is one line of the scenario's `map` of X-Tier to a rate and burst.
type Tier struct {
	// Name is the header value, "default" for the map's default.
	Name string
	// Rate is the tokens per second of the tier.
	Rate int64
	// Burst is the tier's burst (token and leaky buckets).
	Burst int64
}

// Ban is a zone's `ban <Duration> after <After> in <Window>`.
type Ban struct {
	Duration, Window time.Duration
	After            int64
}

// Zone is one zone of the scenario's rate_limit block.
type Zone struct {
	// Name is the zone's name, z0, z1, ...
	Name string
	// Algorithm is one of the six algorithms.
	Algorithm string
	// Global keys the zone by a constant: one bucket for every client.
	// Otherwise the key is `{header.X-Key} {client_ip}`.
	Global bool
	// Rate and Per are the zone's static rate (ignored when Tiered).
	Rate int64
	Per  time.Duration
	// Burst is the static burst (token and leaky buckets).
	Burst int64
	// Tiered takes the rate (and the burst of a bucket) from the tier map.
	Tiered bool
	// Limit and Lease are a concurrency zone's.
	Limit int64
	Lease time.Duration
	// Cost is the static cost; 0 takes it from the X-Cost header.
	Cost int64
	// Reserve is a static reserve percentage; -1 takes it from the
	// X-Reserve header; 0 is none.
	Reserve int
	// Prefetch is the zone's prefetch, 0 for none.
	Prefetch int64
	// Ban is the zone's ban, nil for none.
	Ban *Ban
	// CountStatus lists the statuses or classes the zone counts; empty
	// counts every response.
	CountStatus []string
	// DryRun makes the zone a dry run.
	DryRun bool
	// OnError is local, deny or allow.
	OnError string
	// MaxWaiting is a leaky bucket's max_waiting, 0 for the default.
	MaxWaiting int64
	// Quota, QuotaPer and QuotaTZ are the zone's `quota <n> per <period>
	// tz <zone>`; Quota 0 is none.
	Quota    int64
	QuotaPer string
	QuotaTZ  string
	// SoftShed is a token bucket's soft_shed percentage, 0 for none, and
	// SoftShedMaxDelay its max delay.
	SoftShed         int64
	SoftShedMaxDelay time.Duration
	// CostHeader gives a token bucket zone `cost_header X-Tokens-Used`:
	// it settles the cost the upstream reports.
	CostHeader bool
	// CostAbort, when positive, is the cost_header's abort: what a request
	// whose reported cost never came is charged at least; 0 is the
	// default, the most a settlement charges.
	CostAbort int64
}

// Target is one path of the site: the zones that apply to it.
type Target struct {
	// Path is the request path, /t0, /t1, ...
	Path string
	// Zones are the indexes of the zones matching Path.
	Zones []int
}

// The kinds of clients.
const (
	KindSteady   = "steady"   // one key, as fast as answers come
	KindRotating = "rotating" // a new key every few requests
	KindLong     = "long"     // a 300-byte key
	KindBraces   = "braces"   // a key with braces and colons
	KindUnicode  = "unicode"  // a key with multi-byte characters
	KindSpoof    = "spoof"    // a key equal to the victim's IP address
	KindVictim   = "victim"   // no key (its IP), well within its limit
	KindRefunded = "refunded" // every response uncounted by count_status
	KindAborter  = "aborter"  // gives up on its requests mid-way
	KindHugeCost = "hugecost" // now and then a cost of 2^63-1
	// KindHangUp hangs up mid-stream.
)

// Client is one client of the load.
type Client struct {
	// ID numbers the client.
	ID int
	// Kind is one of the Kind constants.
	Kind string
	// Key is the X-Key it sends; empty sends none (the key is its IP).
	Key string
	// Rotate, when positive, appends a new suffix to Key every Rotate
	// requests.
	Rotate int
	// Tier is the X-Tier it sends.
	Tier string
	// Reserve is the X-Reserve it sends.
	Reserve int
	// Cost is the X-Cost it sends (HugeCost replaces it now and then).
	Cost int64
	// HugeCostEvery, when positive, sends a cost of 2^63-1 every that many
	// requests.
	HugeCostEvery int
	// Status is the status it asks the upstream to answer.
	Status int
	// Sleep is how long it asks the upstream to take.
	Sleep time.Duration
	// Abort, when positive, is when it gives up on a request.
	Abort time.Duration
	// Workers is how many requests it has in flight at once.
	Workers int
	// Pace is the pause between two requests of a worker.
	Pace time.Duration
	// Targets are the indexes of the targets it sends to, in turn.
	Targets []int
	// Source is the loopback address it sends from; empty: 127.0.0.1.
	Source string
	// Stream, when positive, asks the upstream to stream each answer in
	// that many chunks, StreamGap apart; HangUp hangs up after the first
	// chunk of most of them.
	Stream    int
	StreamGap time.Duration
	HangUp    bool
}

// The kinds of faults.
const (
	FaultPause      = "redis-sigstop"     // SIGSTOP for 50-500 ms
	FaultKill       = "redis-sigkill"     // SIGKILL, restarted empty
	FaultClientKill = "redis-client-kill" // CLIENT KILL TYPE normal
	FaultDebugSleep = "redis-debug-sleep" // DEBUG SLEEP
	FaultFailover   = "sentinel-failover" // kill -9 of the master
	FaultReload     = "caddy-reload"      // POST /load with a new config
	FaultNodeKill   = "caddy-kill9"       // kill -9 of a node, restarted
	FaultStress     = "cpu-stress"        // stress-ng on every CPU
)

// Fault is one fault injected during the load.
type Fault struct {
	// Kind is one of the Fault constants.
	Kind string
	// At is when it starts, from the start of the load.
	At time.Duration
	// For is how long it lasts (a pause, a sleep, the stress); zero for
	// an instant fault.
	For time.Duration
	// Node is the Caddy node it acts on (reload, kill -9), or which Redis
	// server (Cluster: which master).
	Node int
}

// Scenario is everything a seed draws.
type Scenario struct {
	// Seed is what the scenario was drawn from.
	Seed uint64
	// Topology is where the buckets live.
	Topology Topology
	// Nodes is the fleet's size.
	Nodes int
	// Load is how long the clients send.
	Load time.Duration
	// Tiers are the lines of the tier map.
	Tiers []Tier
	// Zones, Targets and Clients are the configuration and the load.
	Zones   []*Zone
	Targets []*Target
	Clients []*Client
	// Faults are in the order they start.
	Faults []Fault
	// Resets are the key resets sent during the load, in order.
	Resets []KeyReset
	// VictimTarget is the index of the target the victim and the spoofer
	// share, -1 when there is none.
	VictimTarget int
	// Exempt is the scenario's exemption, nil for none.
	Exempt *Exemption
	// HeaderAndTrailer makes the upstream report a cost it sends in a
	// trailer also, as another value, in the header first.
	HeaderAndTrailer bool
	// RLS is the scenario's client of Envoy's rate limit service, nil for
	// none.
	RLS *RLSLoad
}

// Options bound what Draw may choose.
type Options struct {
	// Load is how long the clients send. Default 10s.
	Load time.Duration
	// Topologies, when not empty, restricts the topologies drawn.
	Topologies []Topology
	// Explain prints, with each violation, its trace, the site and the
	// clients (Result.Print); it changes nothing drawn.
	Explain bool
}

// Draw draws a scenario from seed: the same seed and options give the same
// scenario.
func Draw(seed uint64, o Options) *Scenario {
	if o.Load <= 0 {
		o.Load = 10 * time.Second
	}
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	s := &Scenario{Seed: seed, Load: o.Load, VictimTarget: -1}
	tops := o.Topologies
	if len(tops) == 0 {
		tops = []Topology{Single, Single, Cluster, Sentinel, Memory}
	}
	s.Topology = tops[r.IntN(len(tops))]
	s.Nodes = 2 + r.IntN(2)
	if s.Topology == Memory {
		s.Nodes = 1 // each node's memory store is its own: one node is the fleet
	}
	s.Tiers = []Tier{{"gold", 40 + r.Int64N(40), 20 + r.Int64N(20)}, {"default", 10 + r.Int64N(20), 8 + r.Int64N(8)}}
	s.drawZones(r)
	s.drawTargets(r)
	s.drawClients(r)
	s.drawFaults(r)
	s.drawFeatures()
	return s
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

func (s *Scenario) drawZones(r *rand.Rand) {
	n := 2 + r.IntN(4)
	for i := range n {
		z := &Zone{Name: fmt.Sprintf("z%d", i), Algorithm: algorithms[r.IntN(len(algorithms))], OnError: "local"}
		switch r.IntN(8) {
		case 0:
			z.OnError = "deny"
		case 1:
			z.OnError = "allow"
		}
		if z.Algorithm == Concurrency {
			z.Limit = 2 + r.Int64N(4)
			s.Zones = append(s.Zones, z)
			continue
		}
		z.Global = r.IntN(6) == 0
		z.Per = pick(r, time.Second, time.Second, 2*time.Second)
		z.Rate = 8 + r.Int64N(40)
		z.Burst = z.Rate/2 + r.Int64N(z.Rate)
		if z.Algorithm != TokenBucket && z.Algorithm != LeakyBucket {
			z.Burst = 0
		}
		if z.Algorithm == LeakyBucket {
			// A short queue: a request waits at most about a second.
			z.Burst = min(z.Burst, z.Rate*int64(z.Per/time.Second))
		}
		z.Tiered = !z.Global && z.Algorithm != LeakyBucket && r.IntN(4) == 0
		if z.Tiered {
			z.Per = time.Second
		}
		z.Cost = pick(r, int64(1), 2, 0, 0) // 0: from X-Cost, which hostile clients choose
		switch r.IntN(5) {
		case 0:
			z.Reserve = 10 + r.IntN(40)
		case 1:
			z.Reserve = -1
		}
		if (z.Algorithm == TokenBucket || z.Algorithm == FixedWindow) && r.IntN(3) == 0 {
			z.Prefetch = 2 + r.Int64N(6)
		}
		if !z.Global && r.IntN(3) == 0 {
			z.Ban = &Ban{Duration: time.Duration(2+r.IntN(4)) * time.Second, After: 5 + r.Int64N(20), Window: 2 * time.Second}
		}
		if z.Algorithm != LeakyBucket && r.IntN(4) == 0 {
			z.CountStatus = [][]string{{"401"}, {"4xx"}, {"5xx"}, {"2xx", "401"}}[r.IntN(4)]
		}
		z.DryRun = r.IntN(10) == 0
		s.Zones = append(s.Zones, z)
	}
}

// capacity is the most tokens a zone's rule lets one request take: its burst
// (buckets) or its limit per window, the least over the tiers for a tiered
// zone.
func (s *Scenario) capacity(z *Zone) int64 {
	if z.Tiered {
		c := int64(1 << 62)
		for _, t := range s.Tiers {
			if z.Algorithm == TokenBucket {
				c = min(c, t.Burst)
			} else {
				c = min(c, t.Rate)
			}
		}
		return c
	}
	if z.Burst > 0 {
		return z.Burst
	}
	return z.Rate
}

func (s *Scenario) drawTargets(r *rand.Rand) {
	n := 2 + r.IntN(3)
	for i := range n {
		t := &Target{Path: fmt.Sprintf("/t%d", i)}
		k := 1 + r.IntN(min(3, len(s.Zones)))
		for _, zi := range r.Perm(len(s.Zones))[:k] {
			t.Zones = append(t.Zones, zi)
		}
		s.Targets = append(s.Targets, t)
	}
	// The victim's path: the per-client zones of one target, so that the
	// victim's limit is its own.
	var own []int
	for i, z := range s.Zones {
		if !z.Global {
			own = append(own, i)
		}
	}
	if len(own) > 0 && r.IntN(4) != 0 {
		v := &Target{Path: "/v"}
		for _, zi := range r.Perm(len(own))[:1+r.IntN(min(2, len(own)))] {
			v.Zones = append(v.Zones, own[zi])
		}
		s.VictimTarget = len(s.Targets)
		s.Targets = append(s.Targets, v)
	}
}

// hasCountStatus reports whether a zone of target t counts by status.
func (s *Scenario) hasCountStatus(t int) bool {
	for _, zi := range s.Targets[t].Zones {
		if len(s.Zones[zi].CountStatus) > 0 {
			return true
		}
	}
	return false
}

func (s *Scenario) drawClients(r *rand.Rand) {
	add := func(kind, key string) *Client {
		c := &Client{ID: len(s.Clients), Kind: kind, Key: key, Tier: pick(r, "gold", "default", "none"), Cost: pick(r, int64(1), 1, 2, 3), Status: 200, Workers: 1 + r.IntN(2)}
		if r.IntN(4) == 0 {
			c.Status = pick(r, 401, 500)
		}
		if r.IntN(4) == 0 {
			c.Sleep = time.Duration(20+r.IntN(200)) * time.Millisecond
		}
		c.Reserve = pick(r, 0, 0, 20, 40)
		s.Clients = append(s.Clients, c)
		return c
	}
	general := func(c *Client) {
		for _, ti := range r.Perm(len(s.Targets)) {
			if ti == s.VictimTarget || (c.Abort > 0 && s.hasCountStatus(ti)) {
				continue
			}
			c.Targets = append(c.Targets, ti)
			if len(c.Targets) == 2 || r.IntN(2) == 0 {
				break
			}
		}
	}
	tag := fmt.Sprintf("%x", s.Seed%0xfff)
	for i := range 2 + r.IntN(2) {
		general(add(KindSteady, fmt.Sprintf("c%d-%s", i, tag)))
	}
	for _, kind := range r.Perm(6)[:2+r.IntN(3)] {
		switch kind {
		case 0:
			c := add(KindRotating, "rot-"+tag)
			c.Rotate = 5 + r.IntN(20)
			general(c)
		case 1:
			general(add(KindLong, strings.Repeat("L"+tag, 300/(len(tag)+1))))
		case 2:
			general(add(KindBraces, "}{brace:{"+tag+"}"))
		case 3:
			general(add(KindUnicode, "ключ-🔑-"+tag))
		case 4:
			c := add(KindAborter, "abort-"+tag)
			c.Sleep = time.Duration(80+r.IntN(150)) * time.Millisecond
			c.Abort = time.Duration(10+r.IntN(60)) * time.Millisecond
			general(c)
		case 5:
			c := add(KindHugeCost, "huge-"+tag)
			c.HugeCostEvery = 3 + r.IntN(5)
			c.Reserve = 20 + r.IntN(21) // cost + reserve is the sum that wraps
			general(c)
		}
	}
	for _, c := range s.Clients {
		if len(c.Targets) == 0 {
			c.Targets = []int{0}
		}
	}
	s.drawVictim(add)
	s.drawRefunded(r, add, tag)
}

// drawVictim adds, when the scenario has a victim's target, the spoofer,
// which sends the victim's address as its key as fast as it can, and the
// victim, which sends well within its own limit. add adds a client.
func (s *Scenario) drawVictim(add func(kind, key string) *Client) {
	if s.VictimTarget < 0 {
		return
	}
	sp := add(KindSpoof, "127.0.0.1")
	sp.Targets, sp.Workers, sp.Status, sp.Sleep = []int{s.VictimTarget}, 2, 200, 0
	v := add(KindVictim, "")
	v.Targets, v.Workers, v.Cost, v.Status, v.Sleep, v.Tier, v.Reserve = []int{s.VictimTarget}, 1, 1, 200, 0, "default", 0
	v.Pace = s.politePace(s.Targets[s.VictimTarget], v)
}

// drawRefunded adds a client whose every response the count_status zone
// of its target gives back, on the first target whose zone has room for
// it. add adds a client; tag marks the scenario's keys.
func (s *Scenario) drawRefunded(r *rand.Rand, add func(kind, key string) *Client, tag string) {
	for ti, t := range s.Targets {
		if ti == s.VictimTarget {
			continue
		}
		for _, zi := range t.Zones {
			z := s.Zones[zi]
			// Room for the request and three refunds still on their way
			// (a refund is queued after the response, never awaited).
			c := &Client{Cost: 1, Tier: "default"}
			if len(z.CountStatus) == 0 || z.Global || s.capacity(z)-reserveUnits(s.capacity(z), max(z.Reserve, 0)) < 4*s.costOf(z, c) {
				continue
			}
			c = add(KindRefunded, fmt.Sprintf("refund-%s-%d", tag, ti))
			c.Targets, c.Workers, c.Cost, c.Reserve, c.Sleep, c.Tier = []int{ti}, 1, 1, 0, 0, "default"
			// Twice the zone's rate in tokens: without its refunds the
			// bucket drains.
			rate, _ := s.rule(z, c)
			c.Pace = time.Duration(s.costOf(z, c)) * z.Per / time.Duration(2*rate)
			c.Status = 200
			for counted(z.CountStatus, c.Status) {
				c.Status = pick(r, 200, 401, 500, 302)
			}
			return
		}
	}
}

// politePace is the pause between a client's requests that keeps each
// zone of t at a quarter of its rate or less.
func (s *Scenario) politePace(t *Target, c *Client) time.Duration {
	pace := 50 * time.Millisecond
	for _, zi := range t.Zones {
		z := s.Zones[zi]
		if z.Algorithm == Concurrency {
			continue
		}
		rate, _ := s.rule(z, c)
		cost := s.costOf(z, c)
		pace = max(pace, time.Duration(4*cost)*z.Per/time.Duration(rate))
	}
	return pace
}

// rule is a zone's rate and burst (or limit) for client c's tier.
func (s *Scenario) rule(z *Zone, c *Client) (rate, burst int64) {
	if !z.Tiered {
		return z.Rate, z.Burst
	}
	tier := s.Tiers[len(s.Tiers)-1]
	for _, t := range s.Tiers {
		if t.Name == c.Tier {
			tier = t
		}
	}
	if z.Algorithm == TokenBucket {
		return tier.Rate, tier.Burst
	}
	return tier.Rate, 0
}

// costOf is the cost of c's ordinary requests in zone z.
func (s *Scenario) costOf(z *Zone, c *Client) int64 {
	if z.Algorithm == Concurrency {
		return 1
	}
	if z.Cost > 0 {
		return z.Cost
	}
	return c.Cost
}

// reserveOf is the reserve percentage of c's requests in zone z.
func (s *Scenario) reserveOf(z *Zone, c *Client) int {
	if z.Reserve < 0 {
		return c.Reserve
	}
	return z.Reserve
}

func (s *Scenario) drawFaults(r *rand.Rand) {
	var kinds []string
	switch s.Topology {
	case Single:
		kinds = []string{FaultPause, FaultKill, FaultClientKill, FaultDebugSleep}
	case Cluster:
		kinds = []string{FaultPause, FaultClientKill, FaultDebugSleep}
	case Sentinel:
		kinds = []string{FaultPause, FaultClientKill, FaultFailover}
	}
	kinds = append(kinds, FaultReload, FaultReload, FaultStress)
	if s.Topology != Memory {
		kinds = append(kinds, FaultNodeKill)
	}
	// Faults start in the first two thirds of the load, so that what they
	// leave behind is seen before it ends.
	span := s.Load * 2 / 3
	failover := false
	for range 1 + r.IntN(4) {
		f := Fault{Kind: kinds[r.IntN(len(kinds))], At: s.Load/10 + time.Duration(r.Int64N(int64(span-s.Load/10)))}
		switch f.Kind {
		case FaultPause:
			f.For = time.Duration(50+r.IntN(451)) * time.Millisecond
			f.Node = r.IntN(3)
		case FaultDebugSleep:
			f.For = time.Duration(100+r.IntN(300)) * time.Millisecond
			f.Node = r.IntN(3)
		case FaultStress:
			f.For = time.Duration(500+r.IntN(1500)) * time.Millisecond
		case FaultReload, FaultNodeKill:
			f.Node = r.IntN(s.Nodes)
		case FaultKill:
			f.For = time.Duration(100+r.IntN(900)) * time.Millisecond
		case FaultFailover:
			if failover {
				continue // one failover a scenario: the old master is gone
			}
			failover = true
		}
		s.Faults = append(s.Faults, f)
	}
	for i := 1; i < len(s.Faults); i++ {
		for j := i; j > 0 && s.Faults[j].At < s.Faults[j-1].At; j-- {
			s.Faults[j], s.Faults[j-1] = s.Faults[j-1], s.Faults[j]
		}
	}
	// A killed node's slots live until their lease ends: a short lease
	// when a node is killed, a long one otherwise, so that a slot that
	// nobody holds is still there when the checker looks.
	lease := 30 * time.Second
	for _, f := range s.Faults {
		if f.Kind == FaultNodeKill {
			lease = 3 * time.Second
		}
	}
	for _, z := range s.Zones {
		if z.Algorithm == Concurrency {
			z.Lease = lease
		}
	}
}

// Summary is a one-line description of the scenario.
func (s *Scenario) Summary() string {
	var zs, fs []string
	for _, z := range s.Zones {
		zs = append(zs, z.Name+":"+z.Algorithm+shedSummary(z)+costSummary(z))
	}
	for _, f := range s.Faults {
		fs = append(fs, f.Kind)
	}
	return fmt.Sprintf("%s x%d, zones [%s], %d clients%s%s, faults [%s]%s", s.Topology, s.Nodes, strings.Join(zs, " "), len(s.Clients), s.streamSummary(), s.rlsSummary(), strings.Join(fs, " "), s.resetsSummary())
}

// counted reports whether a response of status is counted by a zone with
// count_status cs (every status when cs is empty).
func counted(cs []string, status int) bool {
	if len(cs) == 0 {
		return true
	}
	code := fmt.Sprint(status)
	for _, c := range cs {
		if c == code || (strings.HasSuffix(c, "xx") && c[0] == code[0]) {
			return true
		}
	}
	return false
}
