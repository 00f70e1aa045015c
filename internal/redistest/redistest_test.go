package redistest

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestServerDo(t *testing.T) {
	t.Parallel()
	s := Start(t, "--requirepass", "secret")
	if s.Password != "secret" {
		t.Fatalf("Password = %q", s.Password)
	}
	s.MustDo("RPUSH", "l", "a", "b c", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, "PONG"},
		{[]string{"LRANGE", "l", "0", "-1"}, "a\nb c\n"},
		{[]string{"GET", "missing"}, "(nil)"},
		{[]string{"INCRBY", "n", "-7"}, "-7"},
		{[]string{"BLPOP", "empty", "0.01"}, "(nil)"}, // a nil array, as go-redis reads it: nil
	} {
		if got := s.MustDo(c.args...); got != c.want {
			t.Errorf("%v = %q, want %q", c.args, got, c.want)
		}
	}
	if _, err := s.Do("INCR", "l"); err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		t.Errorf("INCR on a list: err = %v, want WRONGTYPE", err)
	}
	if _, err := (&Server{Addr: s.Addr}).Do("PING"); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Errorf("PING without the password: err = %v, want NOAUTH", err)
	}

	// A paused server answers once resumed.
	s.Pause()
	got := make(chan error, 1)
	go func() { _, err := s.Do("PING"); got <- err }()
	select {
	case err := <-got:
		t.Fatalf("a paused server answered: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	s.Resume()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("PING after Resume: %v", err)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("no answer 4s after Resume")
	}

	// Restart loses the data and keeps the address.
	s.MustDo("SET", "k", "v")
	s.Restart()
	if got := s.MustDo("GET", "k"); got != "(nil)" {
		t.Fatalf("GET after Restart = %q, want (nil)", got)
	}
	s.Stop()
	s.Stop()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("a stopped server answered")
	}
}

func TestACL(t *testing.T) {
	t.Parallel()
	s := Start(t)
	u := s.AddUser("pinger", "pw", "+ping")
	if got := u.MustDo("PING"); got != "PONG" {
		t.Fatalf("PING as pinger = %q", got)
	}
	if _, err := u.Do("GET", "x"); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("GET as pinger: err = %v, want NOPERM", err)
	}
	if _, err := s.As("pinger", "wrong").Do("PING"); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("PING with a wrong password: err = %v, want WRONGPASS", err)
	}
	// The limiter's kind of user: scripts on its own keys only.
	rl := s.AddUser("limiter", "pw2", "~rl:*", "+evalsha", "+script|load", "+incr")
	sha := rl.MustDo("SCRIPT", "LOAD", "return redis.call('INCR', KEYS[1])")
	if got := rl.MustDo("EVALSHA", sha, "1", "rl:a"); got != "1" {
		t.Fatalf("EVALSHA on rl:a = %q", got)
	}
	if _, err := rl.Do("EVALSHA", sha, "1", "other"); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("EVALSHA on a key outside ~rl:*: err = %v, want a permission error", err)
	}
	if got := s.MustDo("GET", "rl:a"); got != "1" {
		t.Fatalf("the default user reads rl:a = %q", got)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	files := GenerateTLS(t)
	start := time.Now()
	s := StartTLS(t, files, true)
	t.Logf("TLS server started in %s", time.Since(start).Round(time.Millisecond))
	if got := s.MustDo("PING"); got != "PONG" {
		t.Fatalf("PING over TLS = %q", got)
	}
	if info := s.MustDo("INFO", "server"); !strings.Contains(info, "tcp_port:"+strconv.Itoa(s.Port)) {
		t.Fatalf("INFO server does not show port %d", s.Port)
	}
	if _, err := (&Server{Addr: s.Addr}).Do("PING"); err == nil {
		t.Fatal("a TLS-only server answered plaintext")
	}
	noCert, err := files.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	noCert.Certificates = nil
	if _, err := (&Server{Addr: s.Addr, TLS: noCert}).Do("PING"); err == nil {
		t.Fatal("a server that requires client certificates answered a client without one")
	}

	s2 := StartTLS(t, files, false, "--requirepass", "pw")
	if _, err := (&Server{Addr: s2.Addr, TLS: noCert, Password: "pw"}).Do("PING"); err != nil {
		t.Fatalf("PING without a client certificate where none is required: %v", err)
	}

	// go-redis, as the limiter would connect.
	cfg, _ := files.ClientConfig()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: cfg})
	defer rdb.Close()
	if err := rdb.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatalf("go-redis SET over TLS: %v", err)
	}
	if got := s.MustDo("GET", "k"); got != "v" {
		t.Fatalf("GET k = %q", got)
	}
}

func TestClusterOfTwo(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := StartCluster(t, 2, "--requirepass", "pw", "--masterauth", "pw")
	t.Logf("cluster of 2 (joined by hand) started in %s", time.Since(start).Round(time.Millisecond))
	n := c.Nodes()
	if c.SlotCount(n[0]) != Slots/2 || c.SlotCount(n[1]) != Slots/2 {
		t.Fatalf("slots %d and %d, want %d each", c.SlotCount(n[0]), c.SlotCount(n[1]), Slots/2)
	}
	for i := range 50 {
		c.MustDo("SET", "k"+strconv.Itoa(i), strconv.Itoa(i))
	}
	slot := c.KeySlot("k1")
	to := n[0]
	if c.NodeForSlot(slot) == to {
		to = n[1]
	}
	c.MigrateSlot(slot, to) // with AUTH on MIGRATE
	if c.NodeForSlot(slot) != to {
		t.Fatalf("slot %d not on %s after MigrateSlot", slot, to.Addr)
	}
	if got := to.MustDo("GET", "k1"); got != "1" {
		t.Fatalf("GET k1 on its new node = %q", got)
	}
	other := n[0]
	if other == to {
		other = n[1]
	}
	c.Reshard(to, other, 10)
}

// loadKeys is how many keys incrLoad increments.
const loadKeys = 64

// incrLoad increments keys load:0 to load:63 at random from 8 goroutines
// through go-redis's cluster client, which follows MOVED and ASK, counting
// what it incremented.
type incrLoad struct {
	rdb      *redis.ClusterClient
	counts   [loadKeys]atomic.Int64
	failures atomic.Int64
	firstErr atomic.Value
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// startIncrLoad starts the load on the cluster c.
func startIncrLoad(c *Cluster) *incrLoad {
	l := &incrLoad{rdb: redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	for range 8 {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				k := rand.IntN(loadKeys)
				if err := l.rdb.Incr(context.Background(), "load:"+strconv.Itoa(k)).Err(); err != nil {
					l.failures.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				l.counts[k].Add(1)
			}
		}()
	}
	return l
}

// check stops the load and checks that no command failed and that every
// key holds the increments made.
func (l *incrLoad) check(t *testing.T, c *Cluster) {
	t.Helper()
	l.stop()
	l.wg.Wait()
	if n := l.failures.Load(); n > 0 {
		t.Errorf("%d commands of the load failed while slots moved; the first: %v", n, l.firstErr.Load())
	}
	var total int64
	for k := range loadKeys {
		want := l.counts[k].Load()
		total += want
		got, err := c.Do("GET", "load:"+strconv.Itoa(k))
		if want == 0 && got == "(nil)" {
			continue
		}
		if err != nil || got != strconv.FormatInt(want, 10) {
			t.Errorf("load:%d = %q (%v), want the %d increments made", k, got, err, want)
		}
	}
	t.Logf("%d increments during the moves", total)
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := StartCluster(t, 3)
	t.Logf("cluster of 3 started in %s", time.Since(start).Round(time.Millisecond))
	nodes := c.Nodes()
	if len(nodes) != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("%d nodes, %d addresses", len(nodes), len(c.Addrs()))
	}
	for _, n := range nodes {
		if info := n.MustDo("CLUSTER", "INFO"); !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
			t.Fatalf("%s: CLUSTER INFO:\n%s", n.Addr, info)
		}
	}

	// Keys written before the slots move, and where they live.
	const before = 500
	owner, slot := map[string]*Server{}, map[string]int{}
	for i := range before {
		k := "before:" + strconv.Itoa(i)
		c.MustDo("SET", k, strconv.Itoa(i))
		slot[k] = c.KeySlot(k)
		owner[k] = c.NodeForSlot(slot[k])
	}

	load := startIncrLoad(c)
	defer load.rdb.Close()
	time.Sleep(100 * time.Millisecond)

	from, to := nodes[0], nodes[1]
	movedBefore := c.SlotCount(to)
	t0 := time.Now()
	c.Reshard(from, to, 1000)
	t.Logf("resharding 1000 slots under load took %s", time.Since(t0).Round(time.Millisecond))
	if got := c.SlotCount(to); got != movedBefore+1000 {
		t.Fatalf("target owns %d slots, want %d", got, movedBefore+1000)
	}

	// One slot with keys under load, precisely.
	hot := c.KeySlot("load:7")
	target := nodes[2]
	if c.NodeForSlot(hot) == target {
		target = nodes[0]
	}
	t0 = time.Now()
	c.MigrateSlot(hot, target)
	t.Logf("migrating slot %d under load took %s", hot, time.Since(t0).Round(time.Millisecond))
	if c.NodeForSlot(hot) != target {
		t.Fatalf("slot %d is not on %s", hot, target.Addr)
	}
	time.Sleep(100 * time.Millisecond)
	load.check(t, c)

	moved := 0
	for i := range before {
		k := "before:" + strconv.Itoa(i)
		if got, err := c.Do("GET", k); err != nil || got != strconv.Itoa(i) {
			t.Errorf("GET %s = %q (%v) after the moves, want %d", k, got, err, i)
		}
		if c.NodeForSlot(slot[k]) != owner[k] {
			moved++
		}
	}
	if moved == 0 {
		t.Error("no key written before the resharding moved to another node")
	}
	t.Logf("%d of %d keys written before moved to another node", moved, before)
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	// Passwords that need quoting in sentinel.conf.
	const dataPW, sentinelPW = `data "pw" \ x`, "sentinel pw"
	start := time.Now()
	st := StartSentinel(t, WithMasterName("fleet"), WithPassword(dataPW), WithSentinelPassword(sentinelPW))
	t.Logf("sentinel set-up started in %s", time.Since(start).Round(time.Millisecond))
	if st.MasterName() != "fleet" || len(st.SentinelAddrs()) != 3 || len(st.Sentinels()) != 3 {
		t.Fatalf("name %q, sentinels %v", st.MasterName(), st.SentinelAddrs())
	}
	m := st.Master()
	if m != st.DataNodes()[0] {
		t.Fatalf("Master() = %s, want the first master %s", m.Addr, st.DataNodes()[0].Addr)
	}
	m.MustDo("SET", "k", "v")
	if got := m.MustDo("WAIT", "1", "2000"); got != "1" {
		t.Fatalf("WAIT 1 = %q: the replica did not acknowledge", got)
	}

	old := st.KillMaster()
	if old != m.Addr {
		t.Fatalf("KillMaster() = %s, want %s", old, m.Addr)
	}
	newAddr, took := st.WaitFailover(old, 15*time.Second)
	t.Logf("failover from %s to %s took %s", old, newAddr, took.Round(time.Millisecond))
	if newAddr == old {
		t.Fatal("no new master")
	}
	nm := st.Master()
	if nm.Addr != newAddr || nm != st.DataNodes()[1] {
		t.Fatalf("Master() = %s after failover, want %s, the replica", nm.Addr, newAddr)
	}
	if got := nm.MustDo("GET", "k"); got != "v" {
		t.Fatalf("GET k on the new master = %q", got)
	}

	// go-redis, as the limiter would connect through the sentinels.
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: st.MasterName(), SentinelAddrs: st.SentinelAddrs(),
		SentinelPassword: sentinelPW, Password: dataPW,
	})
	defer rdb.Close()
	if err := rdb.Set(context.Background(), "k2", "v2", 0).Err(); err != nil {
		t.Fatalf("go-redis SET through the sentinels: %v", err)
	}
	if got := nm.MustDo("GET", "k2"); got != "v2" {
		t.Fatalf("GET k2 on the new master = %q", got)
	}
}

func TestSentinelWithoutPasswords(t *testing.T) {
	t.Parallel()
	st := StartSentinel(t)
	if st.MasterName() != "mymaster" {
		t.Fatalf("MasterName() = %q", st.MasterName())
	}
	if m := st.Master(); m != st.DataNodes()[0] {
		t.Fatalf("Master() = %s, want %s", m.Addr, st.DataNodes()[0].Addr)
	}
	for _, s := range st.Sentinels() {
		if got := s.MustDo("SENTINEL", "ckquorum", st.MasterName()); !strings.HasPrefix(got, "OK") {
			t.Fatalf("%s: SENTINEL ckquorum = %q", s.Addr, got)
		}
	}
}

func TestFreePort(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("FreePort returned %d twice", p)
		}
		seen[p] = true
	}
}
