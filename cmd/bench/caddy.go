package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// caddyProc is one Caddy process serving one site on a loopback port. The
// admin endpoint is off unless a profile or the metrics are wanted, and
// everything Caddy prints goes to a log file.
type caddyProc struct {
	URL   string // the site's base URL, http://127.0.0.1:port
	Admin string // host:port of the admin endpoint, when enabled
	PID   int

	logPath string
	stop    func()
}

// startCaddy runs bin with the site block site on a free port, pinned to
// the Caddy CPU, and waits until it answers.
func startCaddy(e *env, pin pinning, bin, site string, admin bool) *caddyProc {
	dir := e.TempDir()
	port := redistest.FreePort(e)
	adminLine := "admin off"
	c := &caddyProc{URL: fmt.Sprintf("http://127.0.0.1:%d", port), logPath: filepath.Join(dir, "caddy.log")}
	if admin {
		c.Admin = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(e))
		adminLine = "admin " + c.Admin
	}
	cfg := fmt.Sprintf("{\n\t%s\n\tpersist_config off\n\tauto_https off\n}\n\nhttp://127.0.0.1:%d {\n%s\n}\n", adminLine, port, site)
	cfgPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		e.Fatal(err)
	}
	logFile, err := os.Create(c.logPath)
	if err != nil {
		e.Fatal(err)
	}
	defer logFile.Close()
	cmd := pin.command(pin.caddyCPU, bin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if err := cmd.Start(); err != nil {
		e.Fatalf("starting caddy: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	c.PID = cmd.Process.Pid // taskset execs caddy: same process
	stopped := false
	c.stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Kill()
		<-exited
	}
	e.Cleanup(c.stop)

	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("GET", c.URL+"/", nil)
		req.Header.Set("X-Key", "ready")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if (resp.StatusCode == 200 && string(body) == "ok") || resp.StatusCode == 429 {
				return c
			}
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(c.logPath)
			e.Fatalf("caddy exited before serving; its output:\n%s", out)
		default:
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(c.logPath)
			e.Fatalf("caddy did not answer on %s within 20s; its output:\n%s", c.URL, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills the process and waits for it.
func (c *caddyProc) Stop() { c.stop() }

var (
	failuresTotalRE = regexp.MustCompile(`"failures_total":\s*(\d+)`)
	failureErrRE    = regexp.MustCompile(`"error":\s*"((?:[^"\\]|\\.)*)"`)
)

// logSize is how much Caddy has logged so far.
func (c *caddyProc) logSize() int64 {
	fi, err := os.Stat(c.logPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// storeFailures reads the log from offset on for the limiter's store
// failure warnings (logged at most once a second, each with the running
// total since Caddy started) and returns how many there were, the highest
// total they reported and the first one's error.
func (c *caddyProc) storeFailures(offset int64) (warnings int, total int64, first string) {
	b, err := os.ReadFile(c.logPath)
	if err != nil || offset > int64(len(b)) {
		return 0, 0, ""
	}
	for line := range strings.SplitSeq(string(b[offset:]), "\n") {
		if !strings.Contains(line, "rate limit store failed") {
			continue
		}
		warnings++
		if m := failuresTotalRE.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			total = max(total, n)
		}
		if m := failureErrRE.FindStringSubmatch(line); m != nil && first == "" {
			first = m[1]
		}
	}
	return warnings, total, first
}

// storeDecisions returns how many decisions Caddy has sent to the shared
// store: the count of the caddy_rate_limit_store_duration_seconds
// histogram, summed over its series, from the admin endpoint's /metrics.
func storeDecisions(admin string) (int64, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var n int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "caddy_rate_limit_store_duration_seconds_count") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metrics line %q: %w", line, err)
		}
		n += int64(v)
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return n, nil // 0 when there is no series yet
}
