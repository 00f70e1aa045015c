package localfleet

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// evalshaCalls finds the EVALSHA calls in INFO commandstats.
var evalshaCalls = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+)`)

// ScriptCalls returns how many EVALSHA calls r has run since it started
// (INFO commandstats): every decision, prefetch and refund the fleet sent
// it. It is 0 before the first.
func ScriptCalls(r *redistest.Server) (int64, error) {
	info, err := r.Do("INFO", "commandstats")
	if err != nil {
		return 0, fmt.Errorf("redis %s INFO commandstats: %w", r.Addr, err)
	}
	m := evalshaCalls.FindStringSubmatch(info)
	if m == nil {
		return 0, nil
	}
	return strconv.ParseInt(m[1], 10, 64)
}
