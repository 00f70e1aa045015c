package redistest

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// clusterTimeout bounds each wait of the cluster helpers: forming the
// cluster, one resharding, one slot migration.
const clusterTimeout = 30 * time.Second

// Cluster is a Redis Cluster of masters without replicas, started for a
// test and stopped when it ends. Its methods that wait or fail the test
// must be called from the test's goroutine.
type Cluster struct {
	t        T
	nodes    []*Server
	ids      []string // node ids (CLUSTER MYID), as nodes
	busPorts []int    // cluster bus ports, as nodes
	password string
	log      string // redis-cli's output
}

// StartCluster starts masters redis-server processes in cluster mode
// (node timeout 2 s, nodes.conf in each node's directory, bus port from
// FreePort), with extra configuration arguments given to every node (e.g.
// "--requirepass", "x", "--masterauth", "x"), joins them with
// "redis-cli --cluster create" (three masters or more; fewer are joined by
// CLUSTER ADDSLOTSRANGE and MEET) with the slots split evenly, and waits
// until every node reports cluster_state:ok and all agree on the slot map.
func StartCluster(t T, masters int, extra ...string) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("StartCluster: %d masters; a cluster needs one at least", masters)
	}
	requireBinary(t, "redis-cli")
	c := &Cluster{t: t, password: passwordIn(extra), log: filepath.Join(t.TempDir(), "redis-cli.log")}
	logOnFailure(t, "redis-cli (cluster)", c.log)
	for range masters {
		s := newServer(t, "cluster node")
		bus := FreePort(t)
		s.Password = c.password
		s.p.argv = append(append(append([]string{"--port", strconv.Itoa(s.Port)}, s.commonArgs()...),
			"--loglevel", "notice",
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.p.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000",
			"--cluster-port", strconv.Itoa(bus),
		), extra...)
		s.start()
		c.nodes = append(c.nodes, s)
		c.busPorts = append(c.busPorts, bus)
		c.ids = append(c.ids, s.MustDo("CLUSTER", "MYID"))
	}
	if masters >= 3 {
		args := append([]string{"--cluster", "create"}, c.Addrs()...)
		runCLI(t, clusterTimeout, c.log, c.password, append(args, "--cluster-replicas", "0", "--cluster-yes")...)
	} else {
		for i, s := range c.nodes {
			lo, hi := i*Slots/masters, (i+1)*Slots/masters-1
			s.MustDo("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi))
			s.MustDo("CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1))
		}
		for _, s := range c.nodes[1:] {
			s.MustDo("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.nodes[0].Port), strconv.Itoa(c.busPorts[0]))
		}
	}
	c.waitSettled("forming the cluster")
	return c
}

// Addrs returns the nodes' host:port addresses, in start order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr
	}
	return addrs
}

// Nodes returns the nodes in start order. Each one's Do talks to that
// node only; use the Cluster's Do for commands on keys.
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// NodeID returns the cluster node id of s (CLUSTER MYID at start).
func (c *Cluster) NodeID(s *Server) string {
	c.t.Helper()
	for i, n := range c.nodes {
		if n == s {
			return c.ids[i]
		}
	}
	c.t.Fatalf("%s is not a node of this cluster", s.Addr)
	return ""
}

// NodeForSlot returns the node that owns slot, as the first node that
// answers reports it.
func (c *Cluster) NodeForSlot(slot int) *Server {
	c.t.Helper()
	if slot < 0 || slot >= Slots {
		c.t.Fatalf("NodeForSlot(%d): no such slot", slot)
	}
	v, err := c.anyView()
	if err != nil {
		c.t.Fatalf("NodeForSlot(%d): %v", slot, err)
	}
	n := c.byID(v.owner[slot])
	if n == nil {
		c.t.Fatalf("NodeForSlot(%d): slot owned by %q, not a node of this cluster", slot, v.owner[slot])
	}
	return n
}

// KeySlot returns the hash slot of key (CLUSTER KEYSLOT).
func (c *Cluster) KeySlot(key string) int {
	c.t.Helper()
	out, err := c.anyNode().Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		c.t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
	}
	n, err := strconv.Atoi(out)
	if err != nil {
		c.t.Fatalf("CLUSTER KEYSLOT %q: %q", key, out)
	}
	return n
}

// SlotCount returns how many slots s owns, as the first node that answers
// reports it.
func (c *Cluster) SlotCount(s *Server) int {
	c.t.Helper()
	v, err := c.anyView()
	if err != nil {
		c.t.Fatalf("SlotCount: %v", err)
	}
	id := c.NodeID(s)
	n := 0
	for _, o := range v.owner {
		if o == id {
			n++
		}
	}
	return n
}

// Do sends one command to the cluster, following MOVED and ASK
// redirections (and retrying TRYAGAIN) the way a cluster client does, and
// returns the reply rendered as Server.Do renders it. It is safe for
// concurrent use, also while slots move.
func (c *Cluster) Do(args ...string) (string, error) {
	v, err := c.do(args...)
	if err != nil {
		return "", err
	}
	return render(v), nil
}

// MustDo is the Cluster's Do that fails the test on error.
func (c *Cluster) MustDo(args ...string) string {
	c.t.Helper()
	out, err := c.Do(args...)
	if err != nil {
		c.t.Fatalf("redis cluster %v: %v", args, err)
	}
	return out
}

func (c *Cluster) do(args ...string) (any, error) {
	target, asking := c.anyNode(), false
	var err error
	for range 16 {
		var v any
		v, err = target.doAsking(asking, args...)
		if err == nil {
			return v, nil
		}
		switch {
		case isReplyError(err, "MOVED "), isReplyError(err, "ASK "):
			f := strings.Fields(err.Error()) // MOVED 3999 127.0.0.1:6381
			if len(f) != 3 {
				return nil, err
			}
			target, asking = c.byAddr(f[2]), f[0] == "ASK"
		case isReplyError(err, "TRYAGAIN"):
			asking = false
			time.Sleep(20 * time.Millisecond)
		default:
			return nil, err
		}
	}
	return nil, fmt.Errorf("too many redirections, last: %w", err)
}

// anyNode returns the first node that accepts a connection (the first
// node when none does, so that the caller sees the error).
func (c *Cluster) anyNode() *Server {
	for _, n := range c.nodes {
		if accepts(n.Addr) {
			return n
		}
	}
	return c.nodes[0]
}

func (c *Cluster) byAddr(addr string) *Server {
	for _, n := range c.nodes {
		if n.Addr == addr {
			return n
		}
	}
	// A node this helper did not start: talk to it with the same
	// credentials.
	n0 := c.nodes[0]
	return &Server{Addr: addr, Username: n0.Username, Password: n0.Password, TLS: n0.TLS}
}

func (c *Cluster) byID(id string) *Server {
	for i, n := range c.nodes {
		if c.ids[i] == id {
			return n
		}
	}
	return nil
}

// Reshard moves slots slots from one node to another with
// "redis-cli --cluster reshard" (which migrates their keys), and waits
// until every node agrees on the new slot map. Clients that follow
// redirections keep working during the move.
func (c *Cluster) Reshard(from, to *Server, slots int) {
	c.t.Helper()
	fromID, toID := c.NodeID(from), c.NodeID(to)
	if from == to {
		c.t.Fatalf("Reshard: %s is both the source and the target", from.Addr)
	}
	c.waitSettled("before resharding")
	before := c.SlotCount(to)
	runCLI(c.t, clusterTimeout, c.log, c.password, "--cluster", "reshard", from.Addr,
		"--cluster-from", fromID, "--cluster-to", toID,
		"--cluster-slots", strconv.Itoa(slots), "--cluster-yes")
	c.waitSettled("after resharding")
	if after := c.SlotCount(to); after != before+slots {
		c.t.Fatalf("resharding %d slots from %s to %s: the target owned %d slots before and %d after", slots, from.Addr, to.Addr, before, after)
	}
}

// MigrateSlot moves one slot and its keys to the node to, step by step as
// the cluster specification describes: SETSLOT IMPORTING on the target,
// MIGRATING on the source, MIGRATE of the keys in batches until none is
// left, then SETSLOT NODE on the target, the source and the other nodes.
// It waits until every node agrees on the new slot map. Clients that
// follow MOVED and ASK keep working during the move.
func (c *Cluster) MigrateSlot(slot int, to *Server) {
	c.t.Helper()
	toID := c.NodeID(to)
	c.waitSettled("before migrating a slot")
	from := c.NodeForSlot(slot)
	if from == to {
		return
	}
	fromID, s := c.NodeID(from), strconv.Itoa(slot)
	to.MustDo("CLUSTER", "SETSLOT", s, "IMPORTING", fromID)
	from.MustDo("CLUSTER", "SETSLOT", s, "MIGRATING", toID)
	host, port, _ := net.SplitHostPort(to.Addr)
	migrate := []string{"MIGRATE", host, port, "", "0", "5000", "REPLACE"}
	switch {
	case from.Username != "":
		migrate = append(migrate, "AUTH2", from.Username, from.Password)
	case from.Password != "":
		migrate = append(migrate, "AUTH", from.Password)
	}
	moved := 0
	waitUntil(c.t, clusterTimeout, fmt.Sprintf("migrating the keys of slot %d from %s to %s", slot, from.Addr, to.Addr), func() (bool, string) {
		v, err := from.do("CLUSTER", "GETKEYSINSLOT", s, "100")
		if err != nil {
			return false, "CLUSTER GETKEYSINSLOT: " + err.Error()
		}
		keys, _ := v.([]any)
		if len(keys) == 0 {
			return true, ""
		}
		args := append(slices.Clone(migrate), "KEYS")
		for _, k := range keys {
			args = append(args, fmt.Sprint(k))
		}
		if _, err := from.do(args...); err != nil && !isReplyError(err, "NOKEY") {
			return false, fmt.Sprintf("%d keys moved; MIGRATE: %v", moved, err)
		}
		moved += len(keys)
		return false, fmt.Sprintf("%d keys moved", moved)
	})
	to.MustDo("CLUSTER", "SETSLOT", s, "NODE", toID)
	from.MustDo("CLUSTER", "SETSLOT", s, "NODE", toID)
	for _, n := range c.nodes {
		if n != to && n != from {
			n.MustDo("CLUSTER", "SETSLOT", s, "NODE", toID)
		}
	}
	c.waitSettled(fmt.Sprintf("after migrating slot %d", slot))
	if got := c.NodeForSlot(slot); got != to {
		c.t.Fatalf("slot %d migrated to %s is owned by %s", slot, to.Addr, got.Addr)
	}
}

// clusterView is one node's CLUSTER NODES.
type clusterView struct {
	owner [Slots]string     // node id per slot, "" when unassigned
	addrs map[string]string // node id -> host:port
	flags map[string]string // node id -> flags
	open  []string          // slots being migrated or imported
}

func parseClusterNodes(text string) *clusterView {
	v := &clusterView{addrs: map[string]string{}, flags: map[string]string{}}
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		id := f[0]
		addr, _, _ := strings.Cut(f[1], "@")
		v.addrs[id], v.flags[id] = addr, f[2]
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				v.open = append(v.open, r)
				continue
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a < 0 || b >= Slots {
				continue
			}
			for s := a; s <= b; s++ {
				v.owner[s] = id
			}
		}
	}
	return v
}

// slotMap describes the owners as ranges: "0-5460 <id>, ...".
func (v *clusterView) slotMap() string {
	var b strings.Builder
	start := 0
	for s := 1; s <= Slots; s++ {
		if s == Slots || v.owner[s] != v.owner[start] {
			owner := v.owner[start]
			if owner == "" {
				owner = "(unassigned)"
			}
			fmt.Fprintf(&b, "%d-%d %s, ", start, s-1, owner)
			start = s
		}
	}
	return strings.TrimSuffix(b.String(), ", ")
}

func (c *Cluster) view(n *Server) (*clusterView, error) {
	out, err := n.Do("CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return parseClusterNodes(out), nil
}

// anyView is the view of the first node that answers.
func (c *Cluster) anyView() (*clusterView, error) {
	var err error
	for _, n := range c.nodes {
		var v *clusterView
		if v, err = c.view(n); err == nil {
			return v, nil
		}
	}
	return nil, fmt.Errorf("no node answers CLUSTER NODES: %w", err)
}

// settled reports whether every node says cluster_state:ok, knows every
// node as healthy, has no slot in migration and has the same slot map
// with every slot assigned; if not, state says why.
func (c *Cluster) settled() (bool, string) {
	var first *clusterView
	var problems []string
	for _, n := range c.nodes {
		info, err := n.Do("CLUSTER", "INFO")
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: CLUSTER INFO: %v", n.Addr, err))
			continue
		}
		if !strings.Contains(info, "cluster_state:ok") {
			problems = append(problems, n.Addr+": cluster_state is not ok")
		}
		v, err := c.view(n)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: CLUSTER NODES: %v", n.Addr, err))
			continue
		}
		if len(v.addrs) != len(c.nodes) {
			problems = append(problems, fmt.Sprintf("%s knows %d nodes of %d", n.Addr, len(v.addrs), len(c.nodes)))
		}
		for id, f := range v.flags {
			if strings.Contains(f, "fail") || strings.Contains(f, "handshake") || strings.Contains(f, "noaddr") {
				problems = append(problems, fmt.Sprintf("%s sees %s (%s) as %s", n.Addr, v.addrs[id], id, f))
			}
		}
		if len(v.open) > 0 {
			problems = append(problems, fmt.Sprintf("%s has open slots %v", n.Addr, v.open))
		}
		if first == nil {
			first = v
			if m := v.slotMap(); strings.Contains(m, "(unassigned)") {
				problems = append(problems, fmt.Sprintf("%s has unassigned slots: %s", n.Addr, m))
			}
		} else if v.owner != first.owner {
			problems = append(problems, fmt.Sprintf("%s's slot map %s differs from %s's %s", n.Addr, v.slotMap(), c.nodes[0].Addr, first.slotMap()))
		}
	}
	return len(problems) == 0, strings.Join(problems, "\n")
}

// waitSettled waits until settled, failing the test after clusterTimeout.
func (c *Cluster) waitSettled(when string) {
	c.t.Helper()
	waitUntil(c.t, clusterTimeout, "cluster of "+strings.Join(c.Addrs(), " ")+" settling "+when, c.settled)
}
