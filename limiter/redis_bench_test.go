package limiter

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// BenchmarkRedisDecide measures a decision through the pipelined Redis
// store from many goroutines at once (as Caddy's connections do): the
// client-side cost per decision, its allocations, the round trips and
// script calls that concurrent decisions share (decisions/roundtrip,
// decisions/evalsha), and Redis' own time per decision (redis-us/decision,
// from INFO commandstats: EVALSHA's time over the decisions), and the
// buckets Redis holds at the end (keys). The rule is go run ./cmd/bench's
// admitted one (1000 an hour, burst 100,000,000): nothing is denied and
// every bucket lives for the whole run, so with 100,000 keys drawn at
// random each decision reads and writes a bucket among 100,000, as a
// node's clients do. (A rule that refills in microseconds would let the
// buckets expire as soon as they are written, and measure a nearly empty
// Redis.) Redis runs on the same CPUs as the benchmark, so its time
// includes waiting for them.
func BenchmarkRedisDecide(b *testing.B) {
	srv := redistest.Start(b)
	for _, keys := range []int{1, 100_000} {
		b.Run(strconv.Itoa(keys)+" keys", func(b *testing.B) {
			srv.MustDo("FLUSHALL")
			rs := newRedisStore(b, RedisOptions{Address: srv.Addr, Timeout: time.Second})
			r := mustRule(b, "bench", 1000, time.Hour, 100_000_000)
			srv.MustDo("CONFIG", "RESETSTAT")
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(25) // 50 goroutines on 2 CPUs
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				reqs := []Request{{Rule: r, Cost: 1}}
				res := make([]Result, 1)
				for pb.Next() {
					n.Add(1)
					reqs[0].Key = "k" + strconv.Itoa(rand.IntN(keys))
					if ok, err := rs.Decide(context.Background(), reqs, res); err != nil || !ok {
						b.Fatal(ok, err)
					}
				}
			})
			b.StopTimer()
			reads := infoField(srv.MustDo("INFO", "stats"), "total_reads_processed")
			if reads > 0 {
				b.ReportMetric(float64(n.Load())/float64(reads), "decisions/roundtrip")
			}
			if st := commandStats(srv)["evalsha"]; st.calls > 0 {
				b.ReportMetric(float64(n.Load())/float64(st.calls), "decisions/evalsha")
				b.ReportMetric(float64(st.usec)/float64(n.Load()), "redis-us/decision")
			}
			if held, err := strconv.Atoi(srv.MustDo("DBSIZE")); err == nil {
				b.ReportMetric(float64(held), "keys")
			}
		})
	}
}

func infoField(info, name string) int64 {
	for _, line := range splitLines(info) {
		if len(line) > len(name)+1 && line[:len(name)+1] == name+":" {
			v, _ := strconv.ParseInt(line[len(name)+1:], 10, 64)
			return v
		}
	}
	return 0
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			line := s[start:i]
			if len(line) > 0 && line[len(line)-1] == '\r' {
				line = line[:len(line)-1]
			}
			out = append(out, line)
			start = i + 1
		}
	}
	return append(out, s[start:])
}
