// Package redistest starts real redis-server processes for tests, on free
// loopback ports, and stops them when the test ends: single servers (Start),
// TLS servers (StartTLS), a Redis Cluster (StartCluster) and a Sentinel set-up
// with a replica (StartSentinel). Each process writes its log to a file in the
// test's temporary directory, and the logs are printed when the test fails.
package redistest

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// T is the part of testing.TB that the helpers use, so that a command (the
// fleet harness) can use them outside a test too. When the value also has
// Failed and Logf (as testing.TB has), the servers' logs are printed at the
// end of a failed test.
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

var _ T = testing.TB(nil)

// Server is a redis-server process started for a test. A Server value
// made by hand with only an address (and credentials or TLS) can use Do to
// talk to any server; the other methods need one from this package.
type Server struct {
	// Addr is the server's host:port on the loopback interface (the TLS
	// port for a server from StartTLS).
	Addr string
	// Port is the port of Addr.
	Port int
	// Password is the value of a "--requirepass" argument, used by Do.
	Password string
	// Username, when not empty, makes Do authenticate as this ACL user
	// (AUTH Username Password) instead of as the default user. See As.
	Username string
	// TLS, when not nil, makes Do connect with TLS using this
	// configuration. StartTLS sets it to trust the test CA and to present
	// the client certificate.
	TLS *tls.Config

	p *process // nil for a Server value that only names an address
}

// process is the redis-server process behind a Server and its views (As).
type process struct {
	t    T
	argv []string // the arguments after "redis-server"
	dir  string
	log  string // the log file, appended to across restarts

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}               // closed when cmd has exited
	clients map[clientKey]*redis.Client // Do's clients (see client)
}

// Start starts a redis-server with no persistence on a free loopback port,
// with extra configuration arguments (e.g. "--requirepass", "x"), and stops
// it when the test ends. It fails the test when redis-server is missing:
// install it (Debian: apt-get install redis-server).
func Start(t T, extra ...string) *Server {
	t.Helper()
	s := newServer(t, "redis-server")
	s.Password = passwordIn(extra)
	s.p.argv = append(append([]string{"--port", strconv.Itoa(s.Port)}, s.commonArgs()...), extra...)
	s.start()
	return s
}

// newServer reserves a port and a directory for a server that is not
// started yet, and arranges for it to be stopped, and its log printed if
// the test fails, when the test ends.
func newServer(t T, what string) *Server {
	t.Helper()
	requireBinary(t, "redis-server")
	port := FreePort(t)
	dir := t.TempDir()
	s := &Server{
		Port: port,
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		p:    &process{t: t, dir: dir, log: filepath.Join(dir, "redis.log")},
	}
	logOnFailure(t, what+" on "+s.Addr, s.p.log)
	t.Cleanup(s.Stop)
	return s
}

// commonArgs are the arguments of every data server but the port ones.
func (s *Server) commonArgs() []string {
	return []string{
		"--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.p.dir,
		"--daemonize", "no", "--loglevel", "warning",
	}
}

// passwordIn returns the value of the last "--requirepass" in args.
func passwordIn(args []string) string {
	pw := ""
	for i, a := range args {
		if a == "--requirepass" && i+1 < len(args) {
			pw = args[i+1]
		}
	}
	return pw
}

func requireBinary(t T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s is required by this test and is not on PATH (install it: apt-get install redis-server): %v", name, err)
	}
}

func (s *Server) start() {
	p := s.p
	p.t.Helper()
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command("redis-server", p.argv...)
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("starting redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	err = errors.New("no connection accepted")
	for {
		// Only once the port accepts connections: the client's dial
		// failures would be logged.
		if accepts(s.Addr) {
			if _, err = s.Do("PING"); err == nil {
				return
			}
		}
		select {
		case <-done:
			out, _ := os.ReadFile(p.log)
			p.t.Fatalf("redis-server for %s exited at start (%v); its log:\n%s", s.Addr, cmd.ProcessState, out)
		default:
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(p.log)
			p.t.Fatalf("redis-server on %s did not answer PING within 10s (last error: %v); its log:\n%s", s.Addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server and waits for it. Calling it twice is harmless.
func (s *Server) Stop() {
	if s.p == nil {
		return
	}
	p := s.p
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	p.closeClients()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot die
	_ = cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		// Stop may run outside the test's goroutine: report, do not FailNow.
		if e, ok := p.t.(interface{ Errorf(string, ...any) }); ok {
			e.Errorf("redis-server %s (pid %d) did not exit within 10s of SIGKILL", s.Addr, cmd.Process.Pid)
		}
	}
}

// Restart stops the server and starts a new one on the same port: all data
// and the script cache are lost.
func (s *Server) Restart() {
	s.p.t.Helper()
	s.Stop()
	s.start()
}

// As returns a view of the same server whose Do authenticates as the ACL
// user username with password (see AddUser). The view shares the process:
// Stop, Pause and Restart on it act on the server itself.
func (s *Server) As(username, password string) *Server {
	return &Server{Addr: s.Addr, Port: s.Port, Username: username, Password: password, TLS: s.TLS, p: s.p}
}

// Pause stops the server process (SIGSTOP) until Resume: connections stay
// open but nothing is answered, as with a hung server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	if s.p == nil {
		return
	}
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	if s.p.cmd != nil {
		_ = s.p.cmd.Process.Signal(sig)
	}
}

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
func (s *Server) Dir() string { return filepath.Clean(s.p.dir) }
