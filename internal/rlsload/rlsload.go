// Package rlsload drives a closed-loop load of Envoy's ShouldRateLimit
// calls at a rate limit service (RLS v3), as Envoy's global rate limit
// filter sends them: unary calls, each with its own deadline (Envoy's
// default is 20 ms), one descriptor per call. Each caller sends its next
// call when the last one is answered, so the rate is what the service
// sustains. It counts the answers and measures their latency; the caller
// measures the CPU the service and its store spent.
package rlsload

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Load is one closed-loop load.
type Load struct {
	// Domain is the request's domain.
	Domain string
	// Key is the descriptor's one entry key; the entry's value is the
	// client key.
	Key string
	// Keys is how many distinct values the callers draw from, uniformly
	// at random. 1 (or less) sends Value on every call.
	Keys int
	// Value is the one value sent when Keys is 1. The default is "hot".
	Value string
	// Callers is how many calls are in flight at once. The default is 32.
	Callers int
	// Deadline is each call's deadline. The default is 20 ms, Envoy's.
	Deadline time.Duration
	// Duration is how long the load runs.
	Duration time.Duration
}

// Result is what one load measured.
type Result struct {
	// Calls counts the calls sent, Elapsed the time they took.
	Calls   int64
	Elapsed time.Duration
	// OK and OverLimit count the calls answered with that overall code.
	OK, OverLimit int64
	// Missed counts the calls that ended at their deadline.
	Missed int64
	// Errors counts the other failed calls; FirstError is the first one.
	Errors     int64
	FirstError string
	// P50, P99, P999 (the 99.9th percentile) and Max are the latencies
	// of all calls, failed ones included.
	P50, P99, P999, Max time.Duration
}

// PerSecond returns the calls answered per second.
func (r Result) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Calls) / r.Elapsed.Seconds()
}

// FailedShare returns the share of calls that missed their deadline or
// failed, from 0 to 1.
func (r Result) FailedShare() float64 {
	if r.Calls == 0 {
		return 0
	}
	return float64(r.Missed+r.Errors) / float64(r.Calls)
}

// Run runs l against the service at the other end of conn until
// l.Duration has passed or ctx is done.
func Run(ctx context.Context, conn grpc.ClientConnInterface, l Load) (Result, error) {
	if l.Domain == "" || l.Key == "" || l.Duration <= 0 {
		return Result{}, errors.New("rlsload: a load needs a domain, a key and a duration")
	}
	callers := l.Callers
	if callers <= 0 {
		callers = 32
	}
	deadline := l.Deadline
	if deadline <= 0 {
		deadline = 20 * time.Millisecond
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, l.Duration)
	defer cancel()

	tallies := make([]tally, callers)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range tallies {
		wg.Go(func() { tallies[i].run(ctx, client, l, deadline) })
	}
	wg.Wait()
	return merge(tallies, time.Since(start)), nil
}

// tally is one caller's counts and latencies.
type tally struct {
	ok, over, missed, errs int64
	firstErr               string
	lat                    []time.Duration
}

func (t *tally) run(ctx context.Context, client rlsv3.RateLimitServiceClient, l Load, deadline time.Duration) {
	req := &rlsv3.RateLimitRequest{
		Domain: l.Domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: l.Key, Value: "hot"}},
		}},
	}
	entry := req.Descriptors[0].Entries[0]
	if l.Value != "" {
		entry.Value = l.Value
	}
	for ctx.Err() == nil {
		if l.Keys > 1 {
			entry.Value = "k" + strconv.Itoa(rand.IntN(l.Keys))
		}
		callCtx, cancel := context.WithTimeout(context.Background(), deadline)
		began := time.Now()
		resp, err := client.ShouldRateLimit(callCtx, req)
		t.lat = append(t.lat, time.Since(began))
		cancel()
		switch {
		case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
			t.ok++
		case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			t.over++
		case status.Code(err) == codes.DeadlineExceeded:
			t.missed++
		default:
			t.errs++
			if t.firstErr == "" {
				if err == nil {
					err = fmt.Errorf("overall code %v", resp.GetOverallCode())
				}
				t.firstErr = err.Error()
			}
		}
	}
}

// merge adds up the callers' tallies.
func merge(tallies []tally, elapsed time.Duration) Result {
	r := Result{Elapsed: elapsed}
	var lat []time.Duration
	for _, t := range tallies {
		r.OK += t.ok
		r.OverLimit += t.over
		r.Missed += t.missed
		r.Errors += t.errs
		if r.FirstError == "" {
			r.FirstError = t.firstErr
		}
		lat = append(lat, t.lat...)
	}
	r.Calls = int64(len(lat))
	if len(lat) == 0 {
		return r
	}
	slices.Sort(lat)
	r.P50 = lat[len(lat)*50/100]
	r.P99 = lat[min(len(lat)*99/100, len(lat)-1)]
	r.P999 = lat[min(len(lat)*999/1000, len(lat)-1)]
	r.Max = lat[len(lat)-1]
	return r
}
