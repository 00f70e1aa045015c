package observe

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/redis/go-redis/v9"
)

// Fleet counters: every node adds its decision counts per zone, about once
// a second, to per-second totals in Redis, by Redis' clock, so that any node
// can show what the whole fleet decided. The key layout is in
// docs/design.md, "The fleet view in Redis".

// FleetRetention is how long Redis keeps the fleet's per-second counts.
const FleetRetention = 10 * time.Minute

// FleetNodeTimeout is how long a node counts as part of the fleet after its
// last report.
const FleetNodeTimeout = 10 * time.Second

// fleetOutcomeCode names each Outcome in the counters' field names: a short
// storage code of the outcome's name (a: allowed, d: denied, fo:
// failed_open, …), kept as it is so that a fleet mid-upgrade adds into the
// same fields.
var fleetOutcomeCode = [limiter.NumOutcomes]string{
	limiter.Allowed:      "a",
	limiter.Denied:       "d",
	limiter.FailedOpen:   "fo",
	limiter.FailedClosed: "fc",
	limiter.LocalAllowed: "la",
	limiter.LocalDenied:  "ld",
	limiter.Banned:       "b",
	limiter.DryRunDenied: "dd",
}

// FleetReport is one node's decision counts in one zone since its previous
// report, indexed by Outcome.
type FleetReport struct {
	// Zone is the name of the zone the counts are of.
	Zone string
	// Counts holds how many decisions of each Outcome the node made in
	// the zone since its previous report (requests, not tokens), indexed
	// by Outcome; zero counts are not written to Redis.
	Counts [limiter.NumOutcomes]int64
}

// FleetZone is what the whole fleet decided in one zone.
type FleetZone struct {
	// Seconds holds the counts per second, oldest first, indexed by
	// Outcome; the last one is FleetView.End.
	Seconds [][limiter.NumOutcomes]int64
	// Nodes are the ids of the nodes that reported within
	// FleetNodeTimeout, sorted.
	Nodes []string
}

// FleetView is the fleet's recent counts, read from Redis.
type FleetView struct {
	// End is the last second (unix, Redis' clock) in the view: two
	// seconds before Redis' current one, since a node reports about a
	// second late.
	End int64
	// Zones are the zones asked for, by name.
	Zones map[string]*FleetZone
}

// fleetKey returns the prefix of a zone's counter keys.
func (s *redisStats) fleetKey(zone string) string {
	return s.prefix + "fleet:{" + zone + "}:"
}

// fleetReport adds one node's counts to the fleet's counters, at Redis'
// current second, and marks the node present in each zone. It returns how
// many nodes (this one included) reported within FleetNodeTimeout in the
// zone that has the most. It makes two round trips (TIME, then one
// pipeline), and is meant to be called about once a second, off the
// request path.
func (s *redisStats) fleetReport(ctx context.Context, node string, reports []FleetReport) (int, error) {
	if len(reports) == 0 {
		return 0, nil
	}
	now, err := s.client.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("redis time: %w", err)
	}
	sec := now.Unix()
	minute := strconv.FormatInt(sec-sec%60, 10)
	secStr := strconv.FormatInt(sec, 10) + ":"
	retention := FleetRetention
	pipe := s.client.Pipeline()
	cards := make([]*redis.IntCmd, 0, len(reports))
	for _, r := range reports {
		base := s.fleetKey(r.Zone)
		key := base + minute
		wrote := false
		for o, n := range r.Counts {
			if n != 0 {
				pipe.HIncrBy(ctx, key, secStr+fleetOutcomeCode[o], n)
				wrote = true
			}
		}
		if wrote {
			pipe.Expire(ctx, key, retention)
		}
		nodes := base + "nodes"
		pipe.ZAdd(ctx, nodes, redis.Z{Score: float64(sec), Member: node})
		pipe.ZRemRangeByScore(ctx, nodes, "-inf", "("+strconv.FormatInt(sec-int64(FleetNodeTimeout/time.Second), 10))
		cards = append(cards, pipe.ZCard(ctx, nodes))
		pipe.Expire(ctx, nodes, 2*FleetNodeTimeout)
	}
	cmds, err := pipe.Exec(ctx)
	for _, c := range cmds {
		if c.Err() != nil {
			return 0, fmt.Errorf("redis fleet counters: %w", c.Err())
		}
	}
	if err != nil {
		return 0, fmt.Errorf("redis fleet counters: %w", err)
	}
	most := 0
	for _, c := range cards {
		most = max(most, int(c.Val()))
	}
	return most, nil
}

// fleetRead returns the fleet's counts of the zones over the last seconds
// complete seconds of Redis' clock (at most what FleetRetention keeps).
func (s *redisStats) fleetRead(ctx context.Context, zones []string, seconds int) (*FleetView, error) {
	seconds = max(1, min(seconds, int(FleetRetention/time.Second)-60))
	now, err := s.client.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("redis time: %w", err)
	}
	end := now.Unix() - 2
	start := end - int64(seconds) + 1
	view := &FleetView{End: end, Zones: make(map[string]*FleetZone, len(zones))}
	pipe := s.client.Pipeline()
	type read struct {
		zone    string
		minutes []*redis.MapStringStringCmd
		nodes   *redis.StringSliceCmd
	}
	reads := make([]read, 0, len(zones))
	for _, z := range zones {
		base := s.fleetKey(z)
		r := read{zone: z}
		for m := start - start%60; m <= end; m += 60 {
			r.minutes = append(r.minutes, pipe.HGetAll(ctx, base+strconv.FormatInt(m, 10)))
		}
		r.nodes = pipe.ZRangeByScore(ctx, base+"nodes", &redis.ZRangeBy{
			Min: strconv.FormatInt(now.Unix()-int64(FleetNodeTimeout/time.Second), 10), Max: "+inf",
		})
		reads = append(reads, r)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis fleet counters: %w", err)
	}
	for _, r := range reads {
		fz := &FleetZone{Seconds: make([][limiter.NumOutcomes]int64, seconds)}
		for _, cmd := range r.minutes {
			for field, val := range cmd.Val() {
				secPart, code, ok := strings.Cut(field, ":")
				if !ok {
					continue
				}
				sec, err := strconv.ParseInt(secPart, 10, 64)
				if err != nil || sec < start || sec > end {
					continue
				}
				o := outcomeOfCode(code)
				if o < 0 {
					continue
				}
				n, err := strconv.ParseInt(val, 10, 64)
				if err != nil {
					continue
				}
				fz.Seconds[sec-start][o] += n
			}
		}
		fz.Nodes = r.nodes.Val()
		sort.Strings(fz.Nodes)
		view.Zones[r.zone] = fz
	}
	return view, nil
}

// outcomeOfCode returns the Outcome a storage code names, or -1.
func outcomeOfCode(code string) int {
	for o, c := range fleetOutcomeCode {
		if c == code {
			return o
		}
	}
	return -1
}
