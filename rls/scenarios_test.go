package rls

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// exampleConfig is envoyproxy/ratelimit's example configuration
// (examples/ratelimit/config/example.yaml), unchanged: the scenarios of its
// integration-test scripts run against it.
const exampleConfig = `---
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: baz
        value: not-so-shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
        shadow_mode: true
      - key: bay
        rate_limit:
          unlimited: true
  - key: unspec
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: qux
    rate_limit:
      unlimited: true
`

// scenarioStores runs a scenario on the memory store and on a Redis of its
// own. The scenarios check answers, not time: their calls and Redis get
// seconds (a loaded machine misses 20ms, and the service then rightly
// answers by the on_error policy); the deadline has tests of its own.
func scenarioStores(t *testing.T, files map[string]string, run func(t *testing.T, e *envoy)) {
	t.Helper()
	t.Run("memory", func(t *testing.T) {
		a := startApp(t, files, nil)
		run(t, patientEnvoy(t, a.addr(0)))
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		a := startApp(t, files, func(a *App) {
			a.Redis = &fleetlimit.RedisConfig{Address: srv.Addr, Timeout: caddy.Duration(5 * time.Second)}
		})
		run(t, patientEnvoy(t, a.addr(0)))
	})
}

// patientEnvoy is an emulator whose calls get seconds.
func patientEnvoy(t *testing.T, addr string) *envoy {
	e := newEnvoy(t, addr)
	e.timeout = 10 * time.Second
	return e
}

// TestTriggerLimit: a key with a value's limit, and a key without a value
// (any value, each its own bucket), as integration-test/scripts
// trigger-ratelimit.sh and value-included-in-stats-key-when-unspecified.sh
// drive them.
func TestTriggerLimit(t *testing.T) {
	scenarioStores(t, map[string]string{"example.yaml": exampleConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Minute)
		// foo (any value) then bar (any value): 3 per minute.
		for i, want := range []uint32{2, 1, 0} {
			resp := e.must("rl", desc("foo", "pelle", "bar", "svensson"))
			if got := answerCodes(resp); got != "OK: OK" || resp.Statuses[0].LimitRemaining != want {
				t.Fatalf("call %d: %s, remaining %d; want OK with %d remaining", i, got, resp.Statuses[0].LimitRemaining, want)
			}
			st := resp.Statuses[0]
			if st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit().String() != "MINUTE" {
				t.Fatalf("current_limit %v, want 3 per MINUTE", st.CurrentLimit)
			}
			if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
				t.Fatalf("duration_until_reset %s, want the rest of the minute", d)
			}
		}
		resp := e.must("rl", desc("foo", "pelle", "bar", "svensson"))
		if got := answerCodes(resp); got != "OVER_LIMIT: OVER_LIMIT" || resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("4th call: %s remaining %d, want OVER_LIMIT with 0", got, resp.Statuses[0].LimitRemaining)
		}
		// Another value of the key without a value has its own bucket.
		if got := answerCodes(e.must("rl", desc("foo", "pelle", "bar", "other"))); got != "OK: OK" {
			t.Fatalf("another bar value: %s, want OK", got)
		}
		// The key alone (unspec, any value): 2 per minute per value.
		for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
			if got := answerCodes(e.must("rl", desc("unspec", "v1"))); got != want {
				t.Fatalf("unspec call %d: %s, want %s", i, got, want)
			}
		}
	})
}

// TestAllOrNothing sends many descriptors per call, one of which is over
// its limit: the call is over the limit, and no other descriptor is
// charged (envoyproxy/ratelimit charges them all).
func TestAllOrNothing(t *testing.T) {
	scenarioStores(t, map[string]string{"example.yaml": exampleConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Minute)
		mock := desc("source_cluster", "proxy", "destination_cluster", "mock") // 1 per minute
		if got := answerCodes(e.must("rl", mock)); got != "OK: OK" {
			t.Fatalf("first mock call: %s", got)
		}
		// 40 descriptors on buckets of 3 per minute, and mock, now over.
		var ds []*ratelimitv3.RateLimitDescriptor
		for i := range 40 {
			ds = append(ds, desc("foo", "f", "bar", string(rune('a'+i%26))+string(rune('a'+i/26))))
		}
		ds = append(ds, mock)
		for round := range 5 {
			resp := e.must("rl", ds...)
			if resp.OverallCode.String() != "OVER_LIMIT" || resp.Statuses[40].Code.String() != "OVER_LIMIT" {
				t.Fatalf("round %d: %s, want OVER_LIMIT by the last descriptor", round, answerCodes(resp))
			}
			for i := range 40 {
				if st := resp.Statuses[i]; st.Code.String() != "OK" || st.LimitRemaining != 3 {
					t.Fatalf("round %d, descriptor %d: %s with %d remaining, want OK with 3 (nothing charged)", round, i, st.Code, st.LimitRemaining)
				}
			}
		}
		// Without mock, every bucket is full: the denied calls charged none.
		resp := e.must("rl", ds[:40]...)
		if got := remaining(resp); slices.ContainsFunc(got, func(r uint32) bool { return r != 2 }) {
			t.Fatalf("after the denied calls, remaining %v, want 2 everywhere (one charge each)", got)
		}
	})
}

// TestReplaces follows replaces.sh: a rule that names another replaces it
// for the call, and a replaced rule of 0 (banned) does not deny.
func TestReplaces(t *testing.T) {
	scenarioStores(t, map[string]string{"example.yaml": exampleConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Minute)
		bk := desc("foo", "my_foo", "bar", "bkthomps") // bkthomps: 1 per minute
		if got := answerCodes(e.must("rl", bk)); got != "OK: OK" {
			t.Fatalf("bkthomps alone: %s", got)
		}
		if got := answerCodes(e.must("rl", bk)); got != "OVER_LIMIT: OVER_LIMIT" {
			t.Fatalf("bkthomps alone, second: %s", got)
		}
		// With category=account (4 per minute, replaces bkthomps), the
		// bkthomps rule does not count: 4 calls pass.
		account := desc("category", "account")
		for i := range 4 {
			resp := e.must("rl", bk, account)
			if got := answerCodes(resp); got != "OK: OK OK" || resp.Statuses[0].CurrentLimit != nil {
				t.Fatalf("call %d with account: %s, current_limit %v; want OK, bkthomps replaced", i, got, resp.Statuses[0].CurrentLimit)
			}
		}
		if got := answerCodes(e.must("rl", bk, account)); got != "OVER_LIMIT: OK OVER_LIMIT" {
			t.Fatalf("5th call with account: %s, want the account rule over", got)
		}
		// banned (0 per minute) denies; replaced by override, it does not.
		banned := desc("foo", "my_foo", "bar", "banned")
		if got := answerCodes(e.must("rl", banned)); got != "OVER_LIMIT: OVER_LIMIT" {
			t.Fatalf("banned: %s", got)
		}
		override := desc("source_cluster", "proxy", "destination_cluster", "override")
		if got := answerCodes(e.must("rl", banned, override)); got != "OK: OK OK" {
			t.Fatalf("banned with override: %s, want OK", got)
		}
	})
}

// TestShadowMode follows trigger-shadow-mode-key.sh: a shadow rule over
// its limit reports it and denies nothing.
func TestShadowMode(t *testing.T) {
	scenarioStores(t, map[string]string{"example.yaml": exampleConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Minute)
		shady := desc("foo", "pelle", "baz", "shady") // 3 per minute, shadow
		for i, want := range []uint32{2, 1, 0, 0, 0} {
			resp := e.must("rl", shady)
			if got := answerCodes(resp); got != "OK: OK" || resp.Statuses[0].LimitRemaining != want {
				t.Fatalf("call %d: %s remaining %d, want OK with %d", i, got, resp.Statuses[0].LimitRemaining, want)
			}
		}
	})
}

// TestUnlimited: an unlimited rule answers OK with the largest uint32
// remaining, as the reference, and charges nothing.
func TestUnlimited(t *testing.T) {
	scenarioStores(t, map[string]string{"example.yaml": exampleConfig}, func(t *testing.T, e *envoy) {
		for range 5 {
			resp := e.must("rl", desc("qux", "anything"), desc("foo", "x", "bay", "y"))
			if got := answerCodes(resp); got != "OK: OK OK" || resp.Statuses[0].LimitRemaining != math.MaxUint32 || resp.Statuses[1].LimitRemaining != math.MaxUint32 {
				t.Fatalf("unlimited: %s remaining %v, want OK with %d", got, remaining(resp), uint32(math.MaxUint32))
			}
		}
	})
}

// TestNoRule: an unknown domain, and a descriptor that matches no rule,
// are OK with nothing else, as the reference answers.
func TestNoRule(t *testing.T) {
	scenarioStores(t, map[string]string{"example.yaml": exampleConfig}, func(t *testing.T, e *envoy) {
		for _, domain := range []string{"unknown", "rl"} {
			resp := e.must(domain, desc("nothing", "here"), desc("source_cluster", "proxy"))
			if got := answerCodes(resp); got != "OK: OK OK" || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit != nil {
				t.Fatalf("domain %s: %s %v, want OK without a limit", domain, got, resp.Statuses)
			}
		}
	})
}
