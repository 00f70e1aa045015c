package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// wrkScript drives every configuration. Its one argument is the number of
// keys: 0 sends the header X-Key: hot on every request; n > 0 sends a key
// drawn at random from n keys (requests are built once, in init, so that
// wrk spends its time on the network). done prints one line that the
// harness parses; latencies are in microseconds.
const wrkScript = `
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
end

local reqs, n = {}, 0
function init(args)
  n = tonumber(args[1] or "0") or 0
  math.randomseed(os.time() * 1000 + (tid or 0) * 7919)
  if n == 0 then
    wrk.headers["X-Key"] = "hot"
    reqs[1] = wrk.format()
  else
    for i = 1, n do
      reqs[i] = wrk.format(nil, nil, {["X-Key"] = "key" .. i, ["Host"] = wrk.headers["Host"]})
    end
  end
end

function request()
  if n == 0 then
    return reqs[1]
  end
  return reqs[math.random(n)]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d status_errors=%d connect_errors=%d read_errors=%d write_errors=%d timeouts=%d p50_us=%.1f p99_us=%.1f p999_us=%.1f mean_us=%.1f max_us=%.1f\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.mean, latency.max))
end
`

// wrkResult is what one wrk run reports.
type wrkResult struct {
	Requests   int64
	Duration   time.Duration // the load's wall time, as wrk measured it
	Status     int64         // responses other than 2xx and 3xx
	SockErrors int64         // connect, read, write errors and timeouts
	P50        time.Duration // latency, median
	P99        time.Duration // latency, 99th percentile
	P999       time.Duration // latency, 99.9th percentile
	Mean       time.Duration // latency, mean
	Max        time.Duration // latency, highest
	CPU        time.Duration // wrk's own CPU time
}

// RPS is requests per second.
func (r wrkResult) RPS() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Duration.Seconds()
}

// writeWrkScript writes the script into dir and returns its path.
func writeWrkScript(dir string) (string, error) {
	p := filepath.Join(dir, "bench.lua")
	return p, os.WriteFile(p, []byte(wrkScript), 0o600)
}

// runWrk loads url for d with conns connections over threads threads,
// pinned to the load CPU.
func runWrk(pin pinning, script, url string, threads, conns, keys int, d time.Duration) (wrkResult, error) {
	if threads > conns {
		threads = conns
	}
	secs := max(1, int((d+time.Second/2)/time.Second))
	cmd := pin.command(pin.loadCPU, "wrk",
		"-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns), "-d", strconv.Itoa(secs)+"s",
		"--timeout", "5s", "-s", script, url+"/", "--", strconv.Itoa(keys))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %v\n%s%s", err, out.String(), errOut.String())
	}
	var res wrkResult
	res.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	for line := range strings.SplitSeq(out.String(), "\n") {
		if !strings.HasPrefix(line, "BENCH ") {
			continue
		}
		vals := map[string]float64{}
		for _, f := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return res, fmt.Errorf("wrk: cannot parse %q", f)
			}
			vals[k] = n
		}
		us := func(k string) time.Duration { return time.Duration(vals[k] * float64(time.Microsecond)) }
		res.Requests = int64(vals["requests"])
		res.Duration = us("duration_us")
		res.Status = int64(vals["status_errors"])
		res.SockErrors = int64(vals["connect_errors"] + vals["read_errors"] + vals["write_errors"] + vals["timeouts"])
		res.P50, res.P99, res.P999 = us("p50_us"), us("p99_us"), us("p999_us")
		res.Mean, res.Max = us("mean_us"), us("max_us")
		return res, nil
	}
	return res, fmt.Errorf("wrk printed no BENCH line:\n%s%s", out.String(), errOut.String())
}
