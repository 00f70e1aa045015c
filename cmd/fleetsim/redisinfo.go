package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// serverStats is the part of one Redis server's INFO that the report
// needs: counters whose differences over a run are its figures.
type serverStats struct {
	Addr         string
	CPU          float64 // used_cpu_user + used_cpu_sys, seconds
	EvalshaCalls int64   // cmdstat_evalsha calls
	EvalshaUsec  int64   // cmdstat_evalsha usec: time inside the scripts
	Reads        int64   // total_reads_processed: read events, about one per round trip
}

// sub returns the counters' growth from before to s.
func (s serverStats) sub(before serverStats) serverStats {
	return serverStats{
		Addr:         s.Addr,
		CPU:          s.CPU - before.CPU,
		EvalshaCalls: s.EvalshaCalls - before.EvalshaCalls,
		EvalshaUsec:  s.EvalshaUsec - before.EvalshaUsec,
		Reads:        s.Reads - before.Reads,
	}
}

// parseInfo reads the counters of serverStats from an INFO reply.
func parseInfo(addr, info string) serverStats {
	st := serverStats{Addr: addr}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_cpu_user", "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			st.CPU += f
		case "total_reads_processed":
			st.Reads, _ = strconv.ParseInt(v, 10, 64)
		case "cmdstat_evalsha":
			for f := range strings.SplitSeq(v, ",") {
				name, val, _ := strings.Cut(f, "=")
				switch name {
				case "calls":
					st.EvalshaCalls, _ = strconv.ParseInt(val, 10, 64)
				case "usec":
					st.EvalshaUsec, _ = strconv.ParseInt(val, 10, 64)
				}
			}
		}
	}
	return st
}

// monitor reads INFO from every master of the Redis under test, on its own
// connections (not the simulated nodes').
type monitor struct {
	single  *redis.Client
	cluster *redis.ClusterClient
}

func newMonitor(t target) *monitor {
	if t.cluster {
		return &monitor{cluster: redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: t.addrs, Password: t.password, Username: t.username, MaxRetries: -1,
		})}
	}
	return &monitor{single: redis.NewClient(&redis.Options{
		Addr: t.addrs[0], Password: t.password, Username: t.username, MaxRetries: -1,
	})}
}

// stats returns every master's counters, ordered by address.
func (m *monitor) stats(ctx context.Context) ([]serverStats, error) {
	if m.single != nil {
		info, err := m.single.Info(ctx, "cpu", "stats", "commandstats").Result()
		if err != nil {
			return nil, fmt.Errorf("redis INFO: %w", err)
		}
		return []serverStats{parseInfo(m.single.Options().Addr, info)}, nil
	}
	var mu sync.Mutex
	var all []serverStats
	err := m.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "cpu", "stats", "commandstats").Result()
		if err != nil {
			return fmt.Errorf("redis INFO from %s: %w", c.Options().Addr, err)
		}
		mu.Lock()
		all = append(all, parseInfo(c.Options().Addr, info))
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(all, func(a, b serverStats) int { return strings.Compare(a.Addr, b.Addr) })
	return all, nil
}

// masterOf returns the address of the master that holds key ("" for a
// single server: it holds everything).
func (m *monitor) masterOf(ctx context.Context, key string) string {
	if m.cluster == nil {
		return ""
	}
	c, err := m.cluster.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// deltas returns after minus before, per master (matched by address).
func deltas(before, after []serverStats) []serverStats {
	var out []serverStats
	for _, a := range after {
		for _, b := range before {
			if a.Addr == b.Addr {
				out = append(out, a.sub(b))
			}
		}
	}
	return out
}

// total sums the counters of every master.
func total(ss []serverStats) serverStats {
	var t serverStats
	for _, s := range ss {
		t.CPU += s.CPU
		t.EvalshaCalls += s.EvalshaCalls
		t.EvalshaUsec += s.EvalshaUsec
		t.Reads += s.Reads
	}
	return t
}

func (m *monitor) close() {
	if m.single != nil {
		_ = m.single.Close()
	}
	if m.cluster != nil {
		_ = m.cluster.Close()
	}
}
