// Package redistest starts real redis-server processes for tests, on free
// loopback ports, and stops them when the test ends.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// T is the part of testing.TB that the helpers use, so that a command (the
// fleet harness) can use them outside a test too.
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

var _ T = testing.TB(nil)

// Server is a redis-server process started for a test.
type Server struct {
	// Addr is the server's host:port on the loopback interface.
	Addr string
	// Port is the port of Addr.
	Port int
	// Password is the value of a "--requirepass" argument, used by Do.
	Password string

	t    T
	args []string
	dir  string
	cmd  *exec.Cmd
}

// Start starts a redis-server with no persistence on a free loopback port,
// with extra configuration arguments (e.g. "--requirepass", "x"), and stops
// it when the test ends. It fails the test when redis-server is missing:
// install it (Debian: apt-get install redis-server).
func Start(t T, extra ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is required by this test and is not on PATH (install it: apt-get install redis-server): %v", err)
	}
	s := &Server{t: t, Port: FreePort(t), dir: t.TempDir(), args: extra}
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			s.Password = extra[i+1]
		}
	}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	args := append([]string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--loglevel", "warning",
	}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	logPath := filepath.Join(s.dir, "redis.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logFile.Close()
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := s.Do("PING"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logPath)
			s.t.Fatalf("redis-server on %s did not answer PING within 10s; its log:\n%s", s.Addr, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server and waits for it. Calling it twice is harmless.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot die
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart stops the server and starts a new one on the same port: all data
// and the script cache are lost.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Do sends one command over a fresh connection (inline RESP) and returns
// the reply rendered as text: integers and strings as they are, arrays as
// lines, nil as "(nil)". An error reply is returned as an error.
func (s *Server) Do(args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	if s.Password != "" {
		if err := writeCommand(conn, "AUTH", s.Password); err != nil {
			return "", err
		}
		if _, err := readReply(r); err != nil {
			return "", fmt.Errorf("AUTH: %w", err)
		}
	}
	if err := writeCommand(conn, args...); err != nil {
		return "", err
	}
	return readReply(r)
}

func writeCommand(w io.Writer, args ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// MustDo is Do that fails the test on error.
func (s *Server) MustDo(args ...string) string {
	s.t.Helper()
	out, err := s.Do(args...)
	if err != nil {
		s.t.Fatalf("redis %v: %v", args, err)
	}
	return out
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("%s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "(nil)", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, max(n, 0))
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// Pause stops the server process (SIGSTOP) until Resume: connections stay
// open but nothing is answered, as with a hung server.
func (s *Server) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// handedOut remembers the ports FreePort returned, so that this process
// never hands out one port twice (the kernel may offer a port again as soon
// as the probe's listener is closed, before its user has bound it).
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago and
// that no earlier call in this process returned.
func FreePort(t T) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port
		}
	}
	t.Fatal("no free port found")
	return 0
}

// Dir is the server's working directory.
func (s *Server) Dir() string { return filepath.Clean(s.dir) }
