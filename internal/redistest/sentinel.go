package redistest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sentinelStartTimeout bounds the wait for the replica's sync and for the
// sentinels to find each other.
const sentinelStartTimeout = 20 * time.Second

// Sentinel is a Redis Sentinel set-up started for a test: a master, one
// replica and three sentinels (quorum 2, master down after 1 s, failover
// timeout 5 s), stopped when the test ends. Its methods that wait or fail
// the test must be called from the test's goroutine.
type Sentinel struct {
	t         T
	opt       sentinelOptions
	data      []*Server // the master and the replica, as started
	sentinels []*Server

	mu       sync.Mutex
	killedAt time.Time
}

type sentinelOptions struct {
	name             string
	password         string
	sentinelPassword string
}

// SentinelOption configures StartSentinel.
type SentinelOption func(*sentinelOptions)

// WithMasterName sets the name the sentinels monitor the master under. The
// default is "mymaster".
func WithMasterName(name string) SentinelOption {
	return func(o *sentinelOptions) { o.name = name }
}

// WithPassword protects the master and the replica with a password
// (requirepass and masterauth on both) and gives it to the sentinels
// (sentinel auth-pass). Their Servers' Do authenticate with it. The
// default is no password.
func WithPassword(password string) SentinelOption {
	return func(o *sentinelOptions) { o.password = password }
}

// WithSentinelPassword protects the sentinels themselves with a password
// (requirepass in each sentinel.conf; sentinels use it with each other
// too). Their Servers' Do authenticate with it. The default is no
// password.
func WithSentinelPassword(password string) SentinelOption {
	return func(o *sentinelOptions) { o.sentinelPassword = password }
}

// StartSentinel starts a master, a replica of it and three sentinels that
// monitor it, each sentinel with its own generated sentinel.conf in its
// directory, and waits until the replica is in sync and every sentinel
// knows the master, the replica and the two other sentinels.
func StartSentinel(t T, opts ...SentinelOption) *Sentinel {
	t.Helper()
	st := &Sentinel{t: t, opt: sentinelOptions{name: "mymaster"}}
	for _, o := range opts {
		o(&st.opt)
	}
	// A full sync waits 5 s by default (repl-diskless-sync-delay) for more
	// replicas to join; there is no other one to wait for.
	data := []string{"--loglevel", "notice", "--repl-diskless-sync-delay", "0"}
	if pw := st.opt.password; pw != "" {
		data = append(data, "--requirepass", pw, "--masterauth", pw)
	}
	master := Start(t, data...)
	replica := Start(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}, data...)...)
	st.data = []*Server{master, replica}
	waitUntil(t, sentinelStartTimeout, "replica "+replica.Addr+" syncing with master "+master.Addr, func() (bool, string) {
		info, err := replica.Do("INFO", "replication")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(info, "master_link_status:up"), info
	})

	for range 3 {
		s := newServer(t, "sentinel")
		s.Password = st.opt.sentinelPassword
		conf := filepath.Join(s.p.dir, "sentinel.conf")
		if err := os.WriteFile(conf, []byte(st.conf(s, master)), 0o600); err != nil {
			t.Fatalf("writing %s: %v", conf, err)
		}
		s.p.argv = []string{conf, "--sentinel"}
		s.start()
		st.sentinels = append(st.sentinels, s)
	}
	waitUntil(t, sentinelStartTimeout, "sentinels "+strings.Join(st.SentinelAddrs(), " ")+" discovering master, replica and each other", func() (bool, string) {
		var problems []string
		for _, s := range st.sentinels {
			if p := st.knowsAll(s, master, replica); p != "" {
				problems = append(problems, s.Addr+": "+p)
			}
		}
		return len(problems) == 0, strings.Join(problems, "\n")
	})
	return st
}

// conf is the sentinel.conf of sentinel s. Sentinel rewrites it (its id,
// the peers it found, the current master), so each has its own.
func (st *Sentinel) conf(s, master *Server) string {
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\nbind 127.0.0.1\ndir %s\ndaemonize no\nloglevel notice\nlogfile \"\"\n", s.Port, confQuote(s.p.dir))
	b.WriteString("sentinel resolve-hostnames no\n")
	if pw := st.opt.sentinelPassword; pw != "" {
		fmt.Fprintf(&b, "requirepass %s\n", confQuote(pw))
	}
	n := confQuote(st.opt.name)
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d 2\n", n, master.Port)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s 1000\n", n)
	fmt.Fprintf(&b, "sentinel failover-timeout %s 5000\n", n)
	fmt.Fprintf(&b, "sentinel parallel-syncs %s 1\n", n)
	if pw := st.opt.password; pw != "" {
		fmt.Fprintf(&b, "sentinel auth-pass %s %s\n", n, confQuote(pw))
	}
	return b.String()
}

// confQuote quotes v for a Redis configuration file: in double quotes,
// with backslash, quote and control bytes escaped as Redis reads them.
func confQuote(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\' || c == '"':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\x%02x", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// knowsAll returns what sentinel s does not know yet of the set-up, or ""
// when it knows the master as up, the replica as up and in sync, and the
// two other sentinels.
func (st *Sentinel) knowsAll(s, master, replica *Server) string {
	n := st.opt.name
	addr, err := s.Do("SENTINEL", "get-master-addr-by-name", n)
	if err != nil {
		return "get-master-addr-by-name: " + err.Error()
	}
	if a := strings.Replace(addr, "\n", ":", 1); a != master.Addr {
		return fmt.Sprintf("master is %q, want %s", a, master.Addr)
	}
	m, err := s.do("SENTINEL", "master", n)
	if err != nil {
		return "SENTINEL master: " + err.Error()
	}
	if f := fields(m)["flags"]; f != "master" {
		return "master flags " + f
	}
	replicas, err := s.do("SENTINEL", "replicas", n)
	if err != nil {
		return "SENTINEL replicas: " + err.Error()
	}
	rs, _ := replicas.([]any)
	if len(rs) != 1 {
		return fmt.Sprintf("%d replicas known, want 1", len(rs))
	}
	r := fields(rs[0])
	if r["name"] != replica.Addr || r["flags"] != "slave" || r["master-link-status"] != "ok" {
		return fmt.Sprintf("replica %s flags %s link %s, want %s slave ok", r["name"], r["flags"], r["master-link-status"], replica.Addr)
	}
	others, err := s.do("SENTINEL", "sentinels", n)
	if err != nil {
		return "SENTINEL sentinels: " + err.Error()
	}
	peers, _ := others.([]any)
	var known []string
	for _, o := range peers {
		if f := fields(o); f["flags"] == "sentinel" {
			known = append(known, f["name"])
		}
	}
	if len(known) != len(st.sentinels)-1 {
		return fmt.Sprintf("knows sentinels %v, want the %d others", known, len(st.sentinels)-1)
	}
	return ""
}

// fields turns a flat key-value array reply into a map.
func fields(v any) map[string]string {
	a, _ := v.([]any)
	m := make(map[string]string, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		m[render(a[i])] = render(a[i+1])
	}
	return m
}

// MasterName returns the name the sentinels monitor the master under.
func (st *Sentinel) MasterName() string { return st.opt.name }

// SentinelAddrs returns the sentinels' host:port addresses.
func (st *Sentinel) SentinelAddrs() []string {
	addrs := make([]string, len(st.sentinels))
	for i, s := range st.sentinels {
		addrs[i] = s.Addr
	}
	return addrs
}

// Sentinels returns the sentinel processes (their Do talks Sentinel's
// commands, e.g. "SENTINEL", "masters").
func (st *Sentinel) Sentinels() []*Server { return slices.Clone(st.sentinels) }

// DataNodes returns the master and the replica as they were started (the
// roles change with a failover; Master tells the current one).
func (st *Sentinel) DataNodes() []*Server { return slices.Clone(st.data) }

// Master returns the current master as the first sentinel that answers
// reports it (SENTINEL get-master-addr-by-name).
func (st *Sentinel) Master() *Server {
	st.t.Helper()
	var errs []string
	for _, s := range st.sentinels {
		addr, err := st.masterAddr(s)
		if err != nil {
			errs = append(errs, s.Addr+": "+err.Error())
			continue
		}
		if m := st.dataNode(addr); m != nil {
			return m
		}
		st.t.Fatalf("sentinel %s reports master %s, which this set-up did not start", s.Addr, addr)
	}
	st.t.Fatalf("no sentinel tells the master of %s:\n%s", st.opt.name, strings.Join(errs, "\n"))
	return nil
}

func (st *Sentinel) masterAddr(s *Server) (string, error) {
	v, err := s.do("SENTINEL", "get-master-addr-by-name", st.opt.name)
	if err != nil {
		return "", err
	}
	a, _ := v.([]any)
	if len(a) != 2 {
		return "", fmt.Errorf("get-master-addr-by-name: %q", render(v))
	}
	return net.JoinHostPort(render(a[0]), render(a[1])), nil
}

func (st *Sentinel) dataNode(addr string) *Server {
	for _, d := range st.data {
		if d.Addr == addr {
			return d
		}
	}
	return nil
}

// KillMaster stops the current master's process (as Master reports it)
// and returns its address, for WaitFailover.
func (st *Sentinel) KillMaster() string {
	st.t.Helper()
	m := st.Master()
	m.Stop()
	st.mu.Lock()
	st.killedAt = time.Now()
	st.mu.Unlock()
	return m.Addr
}

// WaitFailover waits until every sentinel that answers reports a master
// other than old, all the same one, and that server says it is a master
// (role:master). It returns the new master's address and how long the
// failover took: since the last KillMaster, or since the call when there
// was none. It fails the test when that takes longer than timeout,
// counted from the same moment.
func (st *Sentinel) WaitFailover(old string, timeout time.Duration) (newAddr string, took time.Duration) {
	st.t.Helper()
	start := time.Now()
	st.mu.Lock()
	if !st.killedAt.IsZero() {
		start = st.killedAt
	}
	st.mu.Unlock()
	waitUntil(st.t, timeout-time.Since(start), "failover of "+st.opt.name+" away from "+old, func() (bool, string) {
		var reports []string
		seen := map[string]bool{}
		for _, s := range st.sentinels {
			addr, err := st.masterAddr(s)
			if err != nil {
				reports = append(reports, s.Addr+": "+err.Error())
				continue
			}
			reports = append(reports, s.Addr+" reports "+addr)
			seen[addr] = true
			newAddr = addr
		}
		if len(seen) != 1 || newAddr == old {
			return false, strings.Join(reports, "\n")
		}
		m := st.dataNode(newAddr)
		if m == nil {
			return false, strings.Join(reports, "\n") + "\n(not a server of this set-up)"
		}
		info, err := m.Do("INFO", "replication")
		if err != nil || !strings.Contains(info, "role:master") {
			return false, fmt.Sprintf("%s\n%s is not master yet: %v %s", strings.Join(reports, "\n"), newAddr, err, info)
		}
		return true, ""
	})
	return newAddr, time.Since(start)
}
