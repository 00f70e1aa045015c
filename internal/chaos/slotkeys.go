package chaos

import (
	"fmt"
	"strconv"
	"strings"
)

// heldSlots reads from Redis the concurrency slots still held: every
// sorted set whose name contains zone and "slots" (the slot keys), with how many
// members each holds and how long the longest lease still runs. It
// returns a short description for a report, "" when none is held or the
// topology has no Redis.
func (b *backend) heldSlots(zone string) string {
	var out []string
	for _, srv := range b.servers() {
		cursor := "0"
		for range 100 {
			v, err := srv.Do("SCAN", cursor, "MATCH", "*"+zone+"*", "TYPE", "zset", "COUNT", "1000")
			if err != nil {
				return "(reading slot keys: " + err.Error() + ")"
			}
			lines := strings.Split(v, "\n")
			cursor = lines[0]
			for _, key := range lines[1:] {
				if key == "" || !strings.Contains(key, "slots") {
					continue // the fleet view's sorted sets share the zone's name
				}
				n, _ := srv.Do("ZCARD", key)
				last, _ := srv.Do("ZRANGE", key, "-1", "-1", "WITHSCORES")
				now, _ := srv.Do("TIME")
				out = append(out, fmt.Sprintf("%s holds %s (lease left %s)", printable(key), n, leaseLeft(last, now)))
			}
			if cursor == "0" {
				break
			}
		}
	}
	if len(out) > 4 {
		out = append(out[:4], fmt.Sprintf("and %d more", len(out)-4))
	}
	return strings.Join(out, "; ")
}

// leaseLeft renders the time from Redis' TIME (seconds and microseconds,
// one a line) to the score of a slot (its lease's end in microseconds).
func leaseLeft(member, now string) string {
	m := strings.Split(member, "\n")
	t := strings.Split(now, "\n")
	if len(m) < 2 || len(t) < 2 {
		return "?"
	}
	score, err1 := strconv.ParseFloat(m[1], 64)
	sec, err2 := strconv.ParseInt(t[0], 10, 64)
	usec, err3 := strconv.ParseInt(t[1], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return "?"
	}
	return fmt.Sprintf("%.1fs", (score-float64(sec*1e6+usec))/1e6)
}
