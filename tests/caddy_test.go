// Package tests runs fleetlimit end to end: real Caddy processes built from
// cmd/caddy, real redis-server processes, real HTTP on loopback.
package tests

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// caddyBin is the Caddy binary built once for the whole test run.
var caddyBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fleetlimit-tests-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	caddyBin = filepath.Join(dir, "caddy")
	build := exec.Command("go", "build", "-o", caddyBin, "./cmd/caddy")
	build.Dir = repoRoot()
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building caddy:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// node is one running Caddy process.
type node struct {
	t       *testing.T
	URL     string // http://127.0.0.1:port
	Admin   string // 127.0.0.1:port of the admin endpoint
	cfgPath string
	cmd     *exec.Cmd
	log     *syncBuffer
	port    int
}

// syncBuffer collects a process's output safely across goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCaddy runs Caddy with a site block on a free port. site is the
// content of the site block; global options may be passed in globals.
// %REDIS% in either is replaced by nothing: callers format their own.
func startCaddy(t *testing.T, globals, site string) *node {
	t.Helper()
	n := &node{t: t, port: redistest.FreePort(t), log: &syncBuffer{}}
	n.Admin = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	n.URL = fmt.Sprintf("http://127.0.0.1:%d", n.port)
	n.cfgPath = filepath.Join(t.TempDir(), "Caddyfile")
	n.writeConfig(globals, site)
	n.cmd = exec.Command(caddyBin, "run", "--config", n.cfgPath, "--adapter", "caddyfile")
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	n.cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("starting caddy: %v", err)
	}
	t.Cleanup(n.stop)
	n.waitReady()
	return n
}

func (n *node) writeConfig(globals, site string) {
	n.t.Helper()
	cfg := fmt.Sprintf("{\n\tadmin %s\n\tpersist_config off\n\tauto_https off\n%s\n}\n\nhttp://127.0.0.1:%d {\n%s\n}\n",
		n.Admin, globals, n.port, site)
	if err := os.WriteFile(n.cfgPath, []byte(cfg), 0o600); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) waitReady() {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		// Ready when this node's admin endpoint serves this node's config
		// (another process could hold a port that was free a moment ago).
		resp, err := http.Get("http://" + n.Admin + "/config/")
		if err == nil {
			cfg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && bytes.Contains(cfg, []byte(fmt.Sprintf(`":%d"`, n.port))) {
				return
			}
		}
		if n.cmd.ProcessState != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.t.Fatalf("caddy did not become ready; its output:\n%s", n.log.String())
}

// reload replaces the site block and reloads the running Caddy through its
// admin endpoint, as `caddy reload` does.
func (n *node) reload(globals, site string) {
	n.t.Helper()
	n.writeConfig(globals, site)
	out, err := exec.Command(caddyBin, "reload", "--config", n.cfgPath, "--adapter", "caddyfile", "--address", n.Admin).CombinedOutput()
	if err != nil {
		n.t.Fatalf("caddy reload: %v\n%s\ncaddy output:\n%s", err, out, n.log.String())
	}
}

func (n *node) stop() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
	n.cmd = nil
}

// response is what a test needs of an HTTP response.
type response struct {
	Status int
	Header http.Header
	Body   string
}

var client = &http.Client{Timeout: 10 * time.Second}

// get sends a request with optional headers ("Name: value").
func (n *node) do(method, path string, headers ...string) response {
	n.t.Helper()
	req, err := http.NewRequest(method, n.URL+path, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := client.Do(req)
	if err != nil {
		n.t.Fatalf("%s %s: %v\ncaddy output:\n%s", method, path, err, n.log.String())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}
}

func (n *node) get(path string, headers ...string) response {
	n.t.Helper()
	return n.do(http.MethodGet, path, headers...)
}

// statuses sends count GET requests and returns how many got each status.
func (n *node) statuses(count int, path string, headers ...string) map[int]int {
	n.t.Helper()
	got := map[int]int{}
	for range count {
		got[n.get(path, headers...).Status]++
	}
	return got
}
