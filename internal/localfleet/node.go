// Package localfleet runs a local fleet for tests and for the fleet harness
// command: Caddy processes built from cmd/caddy, sharing a Caddyfile and a
// Redis, and concurrent HTTP load spread over them.
package localfleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// RepoRoot returns the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// BuildCaddy builds cmd/caddy into dir, with optional build tags, and
// returns the binary's path. What go build printed is in the error of a
// build that failed: the caller may run it beside testing.M.Run, which
// replaces os.Stderr under go test -json.
func BuildCaddy(dir string, tags ...string) (string, error) {
	name := "caddy"
	args := []string{"build", "-o"}
	if len(tags) > 0 {
		name += "-" + strings.Join(tags, "-")
		args = append(args, filepath.Join(dir, name), "-tags", strings.Join(tags, ","))
	} else {
		args = append(args, filepath.Join(dir, name))
	}
	bin := filepath.Join(dir, name)
	build := exec.Command("go", append(args, "./cmd/caddy")...)
	build.Dir = RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building caddy: %w\n%s", err, out)
	}
	return bin, nil
}

// Node is one running Caddy process serving one site on a free loopback
// port, with its admin endpoint on another.
type Node struct {
	// URL is the site's base URL, http://127.0.0.1:port.
	URL string
	// Admin is the host:port of the admin endpoint.
	Admin string
	// Port is the site's port.
	Port int
	// Log holds everything the process printed.
	Log *SyncBuffer

	t       redistest.T
	bin     string
	cfgPath string
	file    bool // cfgPath is the caller's file (StartFile): Reload refuses
	proc    proc
	env     []string
}

// SyncBuffer collects a process's output safely across goroutines.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartNode runs the Caddy binary bin with globals inside the global
// options block and site inside the site block, and waits until it serves
// this configuration. The node is stopped when the test ends. env adds
// environment variables ("NAME=value") to the process.
func StartNode(t redistest.T, bin, globals, site string, env ...string) *Node {
	t.Helper()
	n := &Node{t: t, bin: bin, env: env}
	n.cfgPath = filepath.Join(t.TempDir(), "Caddyfile")
	t.Cleanup(n.Stop)
	// A free port is free when it is picked; another process of the
	// suite (another package's Redis, a Cluster's bus port) may take it
	// before Caddy binds it: then the node starts again on new ports.
	for attempt := 1; ; attempt++ {
		n.Port, n.Log = redistest.FreePort(t), &SyncBuffer{}
		n.Admin = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
		n.URL = fmt.Sprintf("http://127.0.0.1:%d", n.Port)
		n.writeConfig(globals, site)
		cmd := exec.Command(bin, "run", "--config", n.cfgPath, "--adapter", "caddyfile")
		cmd.Env = append(append(os.Environ(), "HOME="+t.TempDir()), env...)
		p, err := startProc("caddy", cmd, n.Log)
		if err != nil {
			t.Fatal(err)
		}
		n.proc = p
		err = n.proc.awaitReady(n.ready, func() string {
			return fmt.Sprintf("caddy did not become ready within %s", readyTimeout)
		})
		switch {
		case err == nil:
			return n
		case attempt < 3 && errors.Is(err, errExitedAtStart) && strings.Contains(n.Log.String(), "address already in use"):
			n.proc.stop()
		default:
			t.Fatal(err)
		}
	}
}

// StartFile runs the Caddy binary bin on the caller's configuration file
// cfg, as `caddy run --config cfg` does, with env added to the process's
// environment (the file can take its ports from it: {$PORT}). It waits
// until the admin endpoint admin (host:port) serves a configuration that
// listens on port. The node is stopped when the test ends; Reload refuses
// to write over the caller's file.
func StartFile(t redistest.T, bin, cfg, admin string, port int, env ...string) *Node {
	t.Helper()
	n := &Node{t: t, bin: bin, Port: port, Admin: admin, Log: &SyncBuffer{}, env: env, cfgPath: cfg, file: true}
	n.URL = fmt.Sprintf("http://127.0.0.1:%d", port)
	cmd := exec.Command(bin, "run", "--config", cfg)
	home := t.TempDir()
	cmd.Env = append(append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_DATA_HOME="+home), env...)
	p, err := startProc("caddy", cmd, n.Log)
	if err != nil {
		t.Fatal(err)
	}
	n.proc = p
	t.Cleanup(n.Stop)
	n.proc.waitReady(t, n.ready, func() string {
		return fmt.Sprintf("caddy on %s did not serve port %d on admin %s within %s", cfg, port, admin, readyTimeout)
	})
	return n
}

func (n *Node) writeConfig(globals, site string) {
	n.t.Helper()
	cfg := fmt.Sprintf("{\n\tadmin %s\n\tpersist_config off\n\tauto_https off\n%s\n}\n\nhttp://127.0.0.1:%d {\n%s\n}\n",
		n.Admin, globals, n.Port, site)
	if err := os.WriteFile(n.cfgPath, []byte(cfg), 0o600); err != nil {
		n.t.Fatal(err)
	}
}

// readyClient asks the admin endpoint whether the node is ready.
var readyClient = &http.Client{Timeout: 2 * time.Second}

// ready reports whether this node's admin endpoint serves this node's
// config (another process could hold a port that was free a moment ago).
func (n *Node) ready() bool {
	resp, err := readyClient.Get("http://" + n.Admin + "/config/")
	if err != nil {
		return false
	}
	cfg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode == 200 && bytes.Contains(cfg, []byte(fmt.Sprintf(`":%d"`, n.Port)))
}

// Reload replaces the configuration and reloads the running Caddy through
// its admin endpoint, as `caddy reload` does.
func (n *Node) Reload(globals, site string) error {
	if n.file {
		return fmt.Errorf("caddy reload: the node runs %s, which Reload does not replace", n.cfgPath)
	}
	n.writeConfig(globals, site)
	out, err := exec.Command(n.bin, "reload", "--config", n.cfgPath, "--adapter", "caddyfile", "--address", n.Admin).CombinedOutput()
	if err != nil {
		return fmt.Errorf("caddy reload: %v\n%s", err, out)
	}
	return nil
}

// Stop kills the process and waits for it. Calling it twice is harmless.
func (n *Node) Stop() { n.proc.stop() }

// Response is what a test needs of an HTTP response.
type Response struct {
	// Status is the response's status code.
	Status int
	// Header is the response's header.
	Header http.Header
	// Body is the whole response body.
	Body string
}

var client = &http.Client{Timeout: 10 * time.Second}

// Do sends one request with optional headers ("Name: value").
func (n *Node) Do(method, path string, headers ...string) (Response, error) {
	return do(method, n.URL+path, headers...)
}

// do sends one request to url with optional headers ("Name: value").
func do(method, url string, headers ...string) (Response, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return Response{}, err
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}, err
}
