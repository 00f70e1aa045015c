package localfleet

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"
)

// OpenLoad is a run in open loop: requests start on a schedule, Rate a
// second for the whole fleet, spread round robin over the nodes, whether or
// not the earlier ones were answered, as many independent HTTP clients make
// them. (Load's connections each wait for an answer before they send again:
// a slower answer there lowers the offered load, here it does not.)
type OpenLoad struct {
	// Nodes are the nodes the requests go to: request i to node i mod
	// len(Nodes).
	Nodes []*Node
	// Target is the request every one sends.
	Target *Target
	// Rate is the offered load, in requests a second for the fleet.
	Rate float64
	// Duration is how long requests are started; those due by its end
	// are all sent and answered.
	Duration time.Duration
	// InFlight is the most requests in flight per node, each on its own
	// keep-alive connection; a request due while that many wait for an
	// answer and as many again are queued is not sent, and counts as
	// Dropped. Default 64.
	InFlight int
}

// OpenReport is what an open-loop run offered, sent and got.
type OpenReport struct {
	*Report
	// Due counts the requests the schedule started; Dropped those not
	// sent because the node had InFlight requests waiting and as many
	// queued (the generator, or the fleet, could not keep up).
	Due, Dropped int64
	// Offered is the requests due a second, Achieved the requests
	// answered a second over the run.
	Offered, Achieved float64
	// LateP50 and LateP99 are how long after its due time a request was
	// sent, in the middle and at the 99th percentile.
	LateP50, LateP99 time.Duration

	target *Target
}

// String summarises the run in one line.
func (r *OpenReport) String() string {
	s := r.Targets[r.target]
	var admitted, requests int64
	if s != nil {
		admitted, requests = s.Admitted, s.Requests
	}
	return fmt.Sprintf("offered %.0f/s, achieved %.0f/s (%d due, %d dropped, sent late p50 %s p99 %s); %d answered, %d admitted",
		r.Offered, r.Achieved, r.Due, r.Dropped, r.LateP50.Round(time.Microsecond), r.LateP99.Round(time.Microsecond), requests, admitted)
}

// RunOpen drives an open-loop load and returns what the fleet admitted.
func RunOpen(ctx context.Context, l OpenLoad) *OpenReport {
	if l.InFlight <= 0 {
		l.InFlight = 64
	}
	type job struct{ due time.Time }
	queues := make([]chan job, len(l.Nodes))
	locals := make([]map[*Target]*TargetStats, len(l.Nodes)*l.InFlight)
	lates := make([][]time.Duration, len(locals))
	var wg sync.WaitGroup
	for n := range l.Nodes {
		queues[n] = make(chan job, l.InFlight)
		for w := range l.InFlight {
			c := n*l.InFlight + w
			wg.Add(1)
			go func() {
				defer wg.Done()
				tr := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true}
				defer tr.CloseIdleConnections()
				cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
				s := newTargetStats(len(l.Nodes))
				locals[c] = map[*Target]*TargetStats{l.Target: s}
				url := l.Nodes[n].URL + l.Target.Path
				for j := range queues[n] {
					sent := time.Now()
					lates[c] = append(lates[c], sent.Sub(j.due))
					a := sendRetrying(cl, url, l.Target.Headers, s)
					s.record(a, sent, l.Target.Cost, n)
				}
			}()
		}
	}
	// The schedule: every millisecond or so, start the requests due by
	// now (a timer's resolution, on a busy machine coarser, does not
	// lower the rate: late requests go out at once).
	start := time.Now()
	end := start.Add(l.Duration)
	interval := time.Duration(float64(time.Second) / l.Rate)
	var due, dropped int64
	for {
		now := time.Now()
		if now.After(end) {
			now = end
		}
		for at := start.Add(time.Duration(due) * interval); !at.After(now); at = start.Add(time.Duration(due) * interval) {
			select {
			case queues[due%int64(len(queues))] <- job{due: at}:
			default:
				dropped++
			}
			due++
		}
		if !now.Before(end) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()

	rep := &OpenReport{Due: due, Dropped: dropped, Offered: float64(due) / l.Duration.Seconds(), target: l.Target}
	rep.Report = &Report{Nodes: len(l.Nodes), Duration: time.Since(start), Targets: mergeTargets(locals, len(l.Nodes))}
	rep.Buckets = bucketStats([]*Target{l.Target}, rep.Targets, len(l.Nodes))
	if s := rep.Targets[l.Target]; s != nil && s.Last.After(s.First) {
		rep.Achieved = float64(s.Requests) / s.Last.Sub(s.First).Seconds()
	}
	var all []time.Duration
	for _, ls := range lates {
		all = append(all, ls...)
	}
	if len(all) > 0 {
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		rep.LateP50, rep.LateP99 = all[len(all)/2], all[len(all)*99/100]
	}
	return rep
}
