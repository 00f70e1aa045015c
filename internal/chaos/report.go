package chaos

import (
	"fmt"
	"strings"
	"time"
)

// The invariants, as violations name them.
const (
	InvBound      = "bound"        // admitted <= exact bound + named allowances
	InvInFlight   = "in-flight"    // concurrency <= limit in flight
	InvSlots      = "slots"        // no slot held by nobody once faults end
	InvBan        = "ban"          // no banned key admitted while banned
	InvCountExact = "count_status" // uncounted responses are given back
	InvIsolation  = "isolation"    // a client within its own limit is never denied
	InvDryRun     = "dry_run"      // a dry-run zone denies nothing
	InvResources  = "resources"    // goroutines, fds, RSS back at baseline
	InvStatus     = "5xx"          // no 5xx but on_error deny's 503 and the app's 500
	InvHarness    = "harness"      // a fault could not be injected
	InvWaiting    = "waiting"      // no leaky bucket waiting room holds a place after the load
)

// Violation is one broken invariant.
type Violation struct {
	// Invariant names the invariant (one of the Inv constants).
	Invariant string
	// Detail says what broke, with the figures.
	Detail string
	// Trace, for a violation about one client or key, lists the faults
	// and that client's requests around the moment it names (printed
	// with Options.Explain).
	Trace string
}

func (v Violation) String() string { return v.Invariant + ": " + v.Detail }

// Result is what one scenario's run found.
type Result struct {
	// Scenario is the scenario that ran.
	Scenario *Scenario
	// Requests counts the requests the clients sent; Admitted those the
	// upstream saw.
	Requests, Admitted int
	// Buckets counts the buckets whose bound was checked.
	Buckets int
	// Quotas are the figures of the keys whose quota was checked.
	Quotas []string
	// Tightest is the bucket that came closest to its bound: its admitted
	// tokens over its exact bound plus allowances (Use), and the figures.
	Tightest Tightness
	// Figures are what the later checks saw: the streams cut by a
	// client's hang-up, the requests soft shed rooms turned away.
	Figures []string
	// Faults are the faults as injected.
	Faults []string
	// Violations are the invariants it broke.
	Violations []Violation
	// Took is how long the run took, start-up included.
	Took time.Duration
}

// Tightness is how close one bucket came to its bound.
type Tightness struct {
	// Use is the admitted tokens over the exact bound plus the named
	// allowances: above 1 is a violation.
	Use float64
	// Zone, Key, Tokens, Bound and Allow are the bucket and its figures.
	Zone, Key            string
	Tokens, Bound, Allow float64
}

// String gives the tightness in one line.
func (t Tightness) String() string {
	return fmt.Sprintf("zone %s key %s admitted %.0f tokens of an exact bound %.1f + allowances %.1f (%.2f of the sum)",
		t.Zone, printable(t.Key), t.Tokens, t.Bound, t.Allow, t.Use)
}

// Repro is the command line that runs this scenario again.
func Repro(seed uint64, o Options) string {
	cmd := fmt.Sprintf("go run ./cmd/fleetchaos -seed %d -scenarios 1 -explain", seed)
	if o.Load > 0 && o.Load != 10*time.Second {
		cmd += " -load " + o.Load.String()
	}
	if len(o.Topologies) > 0 {
		var ts []string
		for _, t := range o.Topologies {
			ts = append(ts, string(t))
		}
		cmd += " -topology " + strings.Join(ts, ",")
	}
	return cmd
}

// Print writes the result: a summary line, then each violation with the
// seed and the reproduction.
func (r *Result) Print(w interface{ Write([]byte) (int, error) }, o Options) {
	s := r.Scenario
	verdict := "ok"
	if len(r.Violations) > 0 {
		verdict = fmt.Sprintf("%d VIOLATIONS", len(r.Violations))
	}
	fmt.Fprintf(w, "seed %d: %s; %d requests, %d admitted, %d buckets, %s: %s\n",
		s.Seed, s.Summary(), r.Requests, r.Admitted, r.Buckets, r.Took.Round(time.Second), verdict)
	if r.Tightest.Use > 0 {
		fmt.Fprintf(w, "  tightest bucket: %s\n", r.Tightest)
	}
	for _, q := range r.Quotas {
		fmt.Fprintf(w, "  quota: %s\n", q)
	}
	for _, f := range r.Figures {
		fmt.Fprintf(w, "  %s\n", f)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  VIOLATION seed %d %s\n    repro: %s\n", s.Seed, v, Repro(s.Seed, o))
		if o.Explain && v.Trace != "" {
			fmt.Fprintf(w, "    trace:\n      %s\n", strings.ReplaceAll(strings.TrimSpace(v.Trace), "\n", "\n      "))
		}
	}
	if o.Explain && len(r.Violations) > 0 {
		fmt.Fprintf(w, "    the site (each node's Caddyfile, its store block left out):\n%s\n", s.Site("\t\t\t# the scenario's store", "upstream", 0))
		for _, c := range s.Clients {
			fmt.Fprintf(w, "    client %d %s key %q tier %s cost %d status %d workers %d targets %v\n", c.ID, c.Kind, printable(c.Key), c.Tier, c.Cost, c.Status, c.Workers, c.Targets)
		}
	}
}
