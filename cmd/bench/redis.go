package main

import (
	"strconv"
	"strings"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// redisInfo is the part of INFO the report needs.
type redisInfo struct {
	EvalshaCalls int64 // cmdstat_evalsha calls
	EvalshaUsec  int64 // cmdstat_evalsha usec: server time, microseconds
	// OtherCalls counts every other command but the harness' own
	// (INFO, CONFIG, FLUSHALL, DBSIZE, RANDOMKEY, MEMORY).
	OtherCalls int64
	Other      map[string]int64 // OtherCalls by command name
	Reads      int64            // total_reads_processed: read events, one per round trip
	CPU        float64          // used_cpu_user + used_cpu_sys, seconds
	UsedMemory int64            // used_memory, bytes
}

// harnessCommands are the commands the harness itself sends.
var harnessCommands = map[string]bool{"info": true, "config|resetstat": true, "flushall": true, "dbsize": true, "randomkey": true, "memory|usage": true}

func readRedisInfo(r *redistest.Server) (redisInfo, error) {
	out, err := r.Do("INFO", "everything")
	if err != nil {
		return redisInfo{}, err
	}
	var in redisInfo
	for line := range strings.SplitSeq(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if name, ok := strings.CutPrefix(k, "cmdstat_"); ok && name != "evalsha" && !harnessCommands[name] {
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			in.OtherCalls += n
			if in.Other == nil {
				in.Other = map[string]int64{}
			}
			in.Other[name] = n
		}
		switch k {
		case "cmdstat_evalsha":
			for f := range strings.SplitSeq(v, ",") {
				name, val, _ := strings.Cut(f, "=")
				switch name {
				case "calls":
					in.EvalshaCalls, _ = strconv.ParseInt(val, 10, 64)
				case "usec":
					in.EvalshaUsec, _ = strconv.ParseInt(val, 10, 64)
				}
			}
		case "total_reads_processed":
			in.Reads, _ = strconv.ParseInt(v, 10, 64)
		case "used_cpu_user", "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			in.CPU += f
		case "used_memory":
			in.UsedMemory, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return in, nil
}

// redisPID returns the server's process id, from INFO server.
func redisPID(r *redistest.Server) (int, error) {
	out, err := r.Do("INFO", "server")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, nil
}

func redisInt(r *redistest.Server, args ...string) (int64, error) {
	out, err := r.Do(args...)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(out), 10, 64)
}
