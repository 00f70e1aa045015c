package lua

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The decide and refund scripts' wire format, declared once: the limiter
// builds ARGV and reads the reply by these positions and values, and the
// .lua files name them (names), assembled with their values (bind)
// (docs/design.md, "The wire format").

// Positions in ARGV.
const (
	// ArgClock is "0" (the clock is Redis TIME) or a fixed time in
	// microseconds, for tests only.
	ArgClock = 1
	// ArgRules is the number of rules; the rules' arguments follow it.
	ArgRules = 2
)

// Positions in a rule's arguments (and in the table the scripts read them
// into), and how many a rule has.
const (
	// RuleAlg is the rule's algorithm (AlgTokenBucket …).
	RuleAlg = 1
	// RuleP1 to RuleP4 are the algorithm's four parameters (see each
	// algorithm's .lua file). A quota's first three change with the
	// node's time: the first instants (us) of the three calendar periods
	// around it; the fourth is the quota.
	RuleP1 = 2
	RuleP2 = 3
	RuleP3 = 4
	RuleP4 = 5
	// RuleFlags holds the rule's flags (RuleDryRun).
	RuleFlags = 6
	// RuleBan is the ban's duration in microseconds, 0 for none.
	RuleBan = 7
	// RuleBanDenials is how many denials within RuleBanWindow start a ban.
	RuleBanDenials = 8
	// RuleBanWindow is the window of the ban's denials, in microseconds.
	RuleBanWindow = 9
	// RulePrefetch is the most tokens an admitted request may take (its
	// cost and spares; token bucket and fixed window), 0 for none.
	RulePrefetch = 10
	// RuleShedAt is a token bucket's soft shed threshold: the debt, in
	// ticks, past which an admitted request is delayed.
	RuleShedAt = 11
	// RuleShedDelay is the soft shed's longest delay in microseconds, 0
	// for no soft shedding.
	RuleShedDelay = 12
	// RuleArgs is how many arguments a rule has.
	RuleArgs = 12
)

// RuleDryRun is the flag (a bit of RuleFlags, the lowest) of a dry-run
// rule: what it would deny does not deny the request.
const RuleDryRun = 1

// The algorithms' ids, as RuleAlg carries them (the limiter's Algorithm
// values).
const (
	AlgTokenBucket   = 0
	AlgSlidingWindow = 1
	AlgFixedWindow   = 2
	AlgSlidingLog    = 3
	AlgLeakyBucket   = 4
	AlgConcurrency   = 5
	// AlgQuota's parameters are not fixed: the node sends the first
	// instants of three periods around its time (see quota.lua).
	AlgQuota = 6
)

// Positions in a zone kind's arguments, and how many a kind has. A kind is
// what zones of a batch may share: a rule, a cost and an aux.
const (
	// KindRule is the index of the kind's rule, from 1.
	KindRule = 1
	// KindCost is the zones' cost (0 in a refund: skip the zone).
	KindCost = 2
	// KindAux is the reserve the request must leave, in the algorithm's
	// units, or a concurrency slot's id; in a refund, the time (us) of the
	// charge refunded, or, for a token or leaky bucket, a charge (see
	// ChargeAux).
	KindAux = 3
	// KindArgs is how many arguments a kind has.
	KindArgs = 3
)

// ChargeAux marks a charge in the refund script: a token or leaky bucket
// zone whose aux is below it (ChargeAux - t, t > 0) is charged t ticks
// instead of refunded: what this node's local fallback admitted while
// Redis could not decide. A charge may leave the bucket owing more than
// its capacity (it is then empty until the debt is paid by the refill).
const ChargeAux = -1

// MaxChargeDebt bounds, in ticks, the debt a charge can leave: the
// arithmetic stays exact in Lua's doubles.
const MaxChargeDebt = 1 << 51

// SeedAux marks a quota's outage charge in the refund script: a quota zone
// whose aux is at or below it (SeedAux - s) carries a seed s, the count a
// node last heard Redis give the key times 1024 plus the tag of its
// period, and charges cost - 1 requests that the node's local quota
// admitted in that period. Redis takes neither in another period; in
// that one it raises the count to at least the seed's, then adds the
// charge (see quota.lua). Below every settlement's charge (ChargeAux -
// MaxChargeDebt), and exact in Lua's doubles with any seed of a quota up
// to twice MaxQuota.
const SeedAux = -(1 << 52)

// RebuiltTTL is how long, in milliseconds, a quota's count that outage
// charges rebuilt (Redis no longer held it) remembers what the charges
// added, so that a node's seed arriving after another's charge raises the
// rest of the count, not the charge: longer than the nodes take to send
// their charges when Redis returns.
const RebuiltTTL = 10_000

// NoZones is the zone argument of a request of no zones.
const NoZones = -1

// RunOf returns the argument that stands, in the decide script, for reps
// identical requests (reps at least 2) of one zone each: the same bucket
// and kind. The zone's argument follows it once, and the reply holds each
// request's values, in turn, as if they had been sent one by one. The
// script decides a run of a fixed window or a token bucket at once.
func RunOf(reps int) int { return -reps }

// PackZone returns a zone's argument: its kind k and its bucket ki (the
// index of the bucket in KEYS; both from 1, with keys buckets in KEYS),
// and whether it is its request's last zone, as one number. zone.lua is
// its one decoder.
func PackZone(k, ki, keys int, last bool) int {
	z := ((k-1)*keys + ki - 1) * 2
	if last {
		z++
	}
	return z
}

// The decide script's reply is, request after request, the request's time
// (us), negative when it is denied (or the request's error in its place),
// then ReplyZone values per zone: in a request's reply from 0, zone i's
// value at position p is at i*ReplyZone + p.
const (
	// ReplyFlag is the zone's flag (FlagDeny …).
	ReplyFlag = 1
	// ReplyR1 to ReplyR3 are what the zone's algorithm reports (see each
	// algorithm's .lua file); for a banned key, the ban's microseconds
	// left and its denials.
	ReplyR1 = 2
	ReplyR2 = 3
	ReplyR3 = 4
	// ReplyDelay is how long an admitted request waits before it is
	// passed on, in microseconds: a token bucket's soft shed delay (0
	// for the others, and for a request not admitted).
	ReplyDelay = 5
	// ReplyZone is how many values a zone has in the reply.
	ReplyZone = 5
)

// ReplyLen returns how many values of the decide script's reply belong to
// a request of zones zones: its time, then ReplyZone per zone.
func ReplyLen(zones int) int { return 1 + ReplyZone*zones }

// The peek script's reply is its time (us), then PeekZone values per zone:
// in the reply from 0, zone i's value at position p is at i*PeekZone + p.
// Its first values are a decision's (ReplyFlag .. ReplyR3, for a cost of
// 0), then the zone's ban.
const (
	// PeekBanLeft is the microseconds the key's ban has left (0: none).
	PeekBanLeft = ReplyZone + 1
	// PeekBanDenials is how many denials started the ban in force.
	PeekBanDenials = ReplyZone + 2
	// PeekDenials is how many denials count towards the next ban.
	PeekDenials = ReplyZone + 3
	// PeekZone is how many values a zone has in the peek reply.
	PeekZone = ReplyZone + 3
)

// PeekLen returns how many values the peek script's reply has for zones
// zones: its time, then PeekZone per zone.
func PeekLen(zones int) int { return 1 + PeekZone*zones }

// A zone's flag in the reply: one of the first four, plus FlagBanStarted
// when this denial started a ban.
const (
	FlagDeny       = 0 // the zone denies the request
	FlagAdmit      = 1 // the zone admits it
	FlagNever      = 2 // no wait makes it admissible
	FlagBanned     = 3 // the key is banned
	FlagBanStarted = 4 // added: this denial started a ban
)

// names are the Lua names of the wire format's constants.
var names = []struct {
	name  string
	value int
}{
	{"ARG_CLOCK", ArgClock},
	{"ARG_RULES", ArgRules},
	{"R_ALG", RuleAlg},
	{"R_P1", RuleP1},
	{"R_P2", RuleP2},
	{"R_P3", RuleP3},
	{"R_P4", RuleP4},
	{"R_FLAGS", RuleFlags},
	{"R_BAN", RuleBan},
	{"R_BAN_DENIALS", RuleBanDenials},
	{"R_BAN_WINDOW", RuleBanWindow},
	{"R_PREFETCH", RulePrefetch},
	{"R_SHED_AT", RuleShedAt},
	{"R_SHED_DELAY", RuleShedDelay},
	{"RULE_ARGS", RuleArgs},
	{"F_DRY_RUN", RuleDryRun},
	{"K_RULE", KindRule},
	{"K_COST", KindCost},
	{"K_AUX", KindAux},
	{"KIND_ARGS", KindArgs},
	{"NO_ZONES", NoZones},
	{"CHARGE", ChargeAux},
	{"MAX_DEBT", MaxChargeDebt},
	{"SEED", SeedAux},
	{"REBUILT_MS", RebuiltTTL},
	{"Z_FLAG", ReplyFlag},
	{"Z_R1", ReplyR1},
	{"Z_R2", ReplyR2},
	{"Z_R3", ReplyR3},
	{"Z_DELAY", ReplyDelay},
	{"ZONE_REPLY", ReplyZone},
	{"P_BAN_LEFT", PeekBanLeft},
	{"P_BAN_DENIALS", PeekBanDenials},
	{"P_DENIALS", PeekDenials},
	{"PEEK_ZONE", PeekZone},
	{"DENY", FlagDeny},
	{"ADMIT", FlagAdmit},
	{"NEVER", FlagNever},
	{"BANNED", FlagBanned},
	{"BAN_STARTED", FlagBanStarted},
}

// header returns the comment that starts each assembled script: the wire
// format's names and values.
func header() string {
	var b strings.Builder
	b.WriteString("-- The wire format (lua/wire.go): the .lua files' names, written below as\n-- their values.\n")
	for _, n := range names {
		fmt.Fprintf(&b, "--   %s = %d\n", n.name, n.value)
	}
	return b.String()
}

// nameRE matches the wire format's names as whole words.
var nameRE = func() *regexp.Regexp {
	alt := make([]string, len(names))
	for i, n := range names {
		alt[i] = n.name
	}
	return regexp.MustCompile(`\b(` + strings.Join(alt, "|") + `)\b`)
}()

// bind writes the values of the wire format's names in place of the names
// in the code of a script (comments keep the names). Names as Lua locals
// would cost every call: the script's body runs in full on each EVALSHA,
// and each function it defines captures the locals it uses as upvalues
// anew.
func bind(script string) string {
	value := make(map[string]string, len(names))
	for _, n := range names {
		v := strconv.Itoa(n.value)
		if n.value < 0 {
			v = "(" + v + ")"
		}
		value[n.name] = v
	}
	lines := strings.SplitAfter(script, "\n")
	for i, line := range lines {
		code, comment, found := strings.Cut(line, "--")
		code = nameRE.ReplaceAllStringFunc(code, func(name string) string { return value[name] })
		if found {
			code += "--" + comment
		}
		lines[i] = code
	}
	return strings.Join(lines, "")
}
