package rls

import (
	"slices"
	"testing"
	"time"
)

// quotaConfig has a regular rule and two quota rules, as for a route with a
// per-tenant limit and two backends' quotas.
const quotaConfig = `
domain: quota
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: model
    value: a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: model
    value: b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// TestQuotaMode: a quota rule over its limit denies nothing while another
// quota rule of the call has room (its status reads OK, as in the
// reference); once all are over, the call is over the limit and the
// regular rule's charge is given back.
func TestQuotaMode(t *testing.T) {
	scenarioStores(t, map[string]string{"quota.yaml": quotaConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Hour)
		call := func() ([]uint32, string) {
			resp := e.must("quota", desc("tenant", "t1"), desc("model", "a"), desc("model", "b"))
			return remaining(resp), answerCodes(resp)
		}
		if left, got := call(); got != "OK: OK OK OK" || !slices.Equal(left, []uint32{4, 0, 1}) {
			t.Fatalf("first call: %s %v, want OK with [4 0 1]", got, left)
		}
		if left, got := call(); got != "OK: OK OK OK" || !slices.Equal(left, []uint32{3, 0, 0}) {
			t.Fatalf("model a over, b not: %s %v, want OK with [3 0 0]", got, left)
		}
		if left, got := call(); got != "OVER_LIMIT: OK OVER_LIMIT OVER_LIMIT" || left[0] != 3 {
			t.Fatalf("both models over: %s %v, want OVER_LIMIT with the tenant at 3", got, left)
		}
		// The tenant's charge of the denied call was given back (beside
		// the answer: wait for it).
		deadline := time.Now().Add(5 * time.Second)
		for {
			resp := e.must("quota", hits(desc("tenant", "t1"), 0))
			if left := resp.Statuses[0].LimitRemaining; left == 3 {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("after the denied call the tenant has %d left, want 3 (its charge given back)", left)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// A regular rule over its limit denies whatever the quotas say.
		e.must("quota", hits(desc("tenant", "t2"), 5))
		if _, got := func() ([]uint32, string) {
			resp := e.must("quota", desc("tenant", "t2"), desc("model", "c"))
			return nil, answerCodes(resp)
		}(); got != "OVER_LIMIT: OVER_LIMIT OK" {
			t.Fatalf("tenant over, no quota rule matched: %s", got)
		}
	})
}

// wildcardConfig has wildcard values, with and without share_threshold,
// under a nested descriptor.
const wildcardConfig = `
domain: files
descriptors:
  - key: route
    value: api
    descriptors:
      - key: path
        value: /files/*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 3}
      - key: path
        value: /own/*
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: path
        value: /own/exact
        rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestWildcards: a wildcard value matches by prefix under a nested
// descriptor; with share_threshold every match shares one bucket, without
// it each value has its own; an exact value wins over the wildcard.
func TestWildcards(t *testing.T) {
	scenarioStores(t, map[string]string{"files.yaml": wildcardConfig}, func(t *testing.T, e *envoy) {
		freshWindow(time.Hour)
		for i, path := range []string{"/files/a", "/files/b", "/files/c", "/files/d"} {
			want := "OK: OK"
			if i == 3 {
				want = "OVER_LIMIT: OVER_LIMIT"
			}
			if got := answerCodes(e.must("files", desc("route", "api", "path", path))); got != want {
				t.Fatalf("shared wildcard, call %d (%s): %s, want %s", i, path, got, want)
			}
		}
		for _, path := range []string{"/own/a", "/own/b"} {
			for i, want := range []string{"OK: OK", "OK: OK", "OVER_LIMIT: OVER_LIMIT"} {
				if got := answerCodes(e.must("files", desc("route", "api", "path", path))); got != want {
					t.Fatalf("own wildcard %s, call %d: %s, want %s", path, i, got, want)
				}
			}
		}
		resp := e.must("files", desc("route", "api", "path", "/own/exact"))
		if got := answerCodes(resp); got != "OK: OK" || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
			t.Fatalf("exact value: %s %v, want OK at 1 per hour", got, resp.Statuses[0].CurrentLimit)
		}
		// The nested descriptor needs its parent entry.
		if resp := e.must("files", desc("path", "/files/a")); resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("path without route matched %v", resp.Statuses[0].CurrentLimit)
		}
	})
}
