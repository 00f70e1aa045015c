package chaos

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
)

// Usage is what a node process holds: goroutines (its /metrics
// go_goroutines), open file descriptors (/proc/<pid>/fd) and resident
// memory (/proc/<pid>/status VmRSS).
type Usage struct {
	pid        int
	goroutines int
	fds        int
	rssKB      int
}

// String gives the usage in one line.
func (u Usage) String() string {
	return fmt.Sprintf("%d goroutines, %d fds, %d MB RSS", u.goroutines, u.fds, u.rssKB/1024)
}

// Margins within which a node's Usage after the run counts as back at its
// baseline: idle keep-alive connections and pools that grew under load
// hold a few goroutines and descriptors, and the heap keeps some of what
// the load allocated.
const (
	goroutineMargin = 40
	fdMargin        = 24
	rssMarginKB     = 64 << 10
	rssFactor       = 1.5
)

// measure reads a node's Usage.
func Measure(n *localfleet.Node) (Usage, error) {
	u := Usage{pid: n.Pid()}
	if u.pid == 0 {
		return u, fmt.Errorf("node not running")
	}
	m, err := n.Metrics()
	if err != nil {
		return u, err
	}
	u.goroutines = int(m.Sum("go_goroutines"))
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", u.pid))
	if err != nil {
		return u, err
	}
	u.fds = len(fds)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", u.pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			u.rssKB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return u, nil
}

// BackAt reports how after exceeds base beyond the margins, or "" when it
// does not.
func BackAt(base, after Usage) string {
	var over []string
	if after.goroutines > base.goroutines+goroutineMargin {
		over = append(over, fmt.Sprintf("goroutines %d -> %d (margin %d)", base.goroutines, after.goroutines, goroutineMargin))
	}
	if after.fds > base.fds+fdMargin {
		over = append(over, fmt.Sprintf("fds %d -> %d (margin %d)", base.fds, after.fds, fdMargin))
	}
	if float64(after.rssKB) > float64(base.rssKB)*rssFactor+rssMarginKB {
		over = append(over, fmt.Sprintf("RSS %d -> %d MB (margin x%.1f + %d MB)", base.rssKB>>10, after.rssKB>>10, rssFactor, rssMarginKB>>10))
	}
	return strings.Join(over, ", ")
}

// topGoroutines returns the three most common goroutine stacks of a node
// (its admin API's /debug/pprof/goroutine?debug=1), each as its count and
// innermost fleetlimit or caddy function, for a report.
func topGoroutines(n *localfleet.Node) string {
	resp, err := http.Get("http://" + n.Admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var out []string
	for _, block := range strings.Split(string(body), "\n\n") {
		lines := strings.Split(strings.TrimSpace(block), "\n")
		count, _, ok := strings.Cut(lines[0], " @ ")
		if !ok {
			continue
		}
		where := ""
		for _, l := range lines[1:] {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), "#"))
			if len(f) >= 2 && where == "" {
				where = f[1]
			}
			if len(f) >= 2 && (strings.Contains(f[1], "fleetlimit") || strings.Contains(f[1], "caddyserver")) {
				where = f[1]
				break
			}
		}
		out = append(out, count+" x "+where)
		if len(out) == 3 {
			break
		}
	}
	return strings.Join(out, "; ")
}
