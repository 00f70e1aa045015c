package limiter

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// ServerMemory is what one Redis server says about its memory in INFO
// memory and INFO stats.
type ServerMemory struct {
	// Addr is the server's host:port as the client knows it; empty for the
	// master a Sentinel client talks to (it resolves the address itself).
	Addr string
	// MaxMemory is the maxmemory setting in bytes; 0 means no limit.
	MaxMemory int64
	// Policy is the maxmemory-policy, e.g. "noeviction" or "volatile-ttl".
	Policy string
	// UsedMemory is used_memory, in bytes.
	UsedMemory int64
	// EvictedKeys is evicted_keys: how many keys the server has evicted
	// since it started (or since CONFIG RESETSTAT).
	EvictedKeys int64
}

// RedisMemory is the memory of the Redis servers that hold the buckets:
// the one server (or the master a Sentinel client talks to), or every
// master of a Cluster.
type RedisMemory struct {
	// Servers holds one reading per server, ordered by address.
	Servers []ServerMemory
	// UsedMemory is the sum of the servers' used_memory, in bytes.
	UsedMemory int64
	// EvictedKeys is the sum of the servers' evicted_keys: how many keys,
	// in all, they have evicted since each started (or since CONFIG
	// RESETSTAT). A count, not a rate; 0 when none has evicted a key.
	EvictedKeys int64
	// MaxMemory is the sum of the servers' maxmemory, or 0 (no limit) when
	// any server has none.
	MaxMemory int64
	// ReadAt is when the memory watch read it (zero from ReadRedisMemory
	// itself), by this node's clock.
	ReadAt time.Time
}

// ReadRedisMemory asks the servers behind client for INFO memory and INFO
// stats: each master of a *redis.ClusterClient, or the server any other
// client talks to. It fails with the first server's error, e.g. NOPERM when
// an ACL refuses INFO (see IsAuth).
func ReadRedisMemory(ctx context.Context, client redis.UniversalClient) (RedisMemory, error) {
	var m RedisMemory
	cc, ok := client.(*redis.ClusterClient)
	if !ok {
		s, err := readServerMemory(ctx, client, serverAddr(client))
		if err != nil {
			return m, err
		}
		m.Servers = []ServerMemory{s}
	} else {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			s, err := readServerMemory(ctx, c, c.Options().Addr)
			if err != nil {
				return err
			}
			mu.Lock()
			m.Servers = append(m.Servers, s)
			mu.Unlock()
			return nil
		})
		if err != nil {
			return RedisMemory{}, err
		}
		slices.SortFunc(m.Servers, func(a, b ServerMemory) int { return strings.Compare(a.Addr, b.Addr) })
	}
	limited := true
	for _, s := range m.Servers {
		m.UsedMemory += s.UsedMemory
		m.EvictedKeys += s.EvictedKeys
		m.MaxMemory += s.MaxMemory
		limited = limited && s.MaxMemory > 0
	}
	if !limited {
		m.MaxMemory = 0
	}
	return m, nil
}

// serverAddr is the address a non-Cluster client talks to, or "" when a
// Sentinel client resolves it.
func serverAddr(client redis.UniversalClient) string {
	c, ok := client.(*redis.Client)
	if !ok || c.Options().Addr == "FailoverClient" { // go-redis' placeholder
		return ""
	}
	return c.Options().Addr
}

// readServerMemory reads one server's INFO memory and INFO stats in one
// round trip (two commands: Redis before 7 takes one section per INFO).
func readServerMemory(ctx context.Context, c redis.Cmdable, addr string) (ServerMemory, error) {
	s := ServerMemory{Addr: addr}
	var mem, stats *redis.StringCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		mem = p.Info(ctx, "memory")
		stats = p.Info(ctx, "stats")
		return nil
	})
	if err == nil {
		err = mem.Err() // a command the pipeline left without a reply
	}
	if err == nil {
		err = stats.Err()
	}
	if err != nil {
		return s, err
	}
	parse := func(text string, field func(k, v string)) {
		for line := range strings.Lines(text) {
			if k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":"); ok {
				field(k, v)
			}
		}
	}
	var bad error
	num := func(k, v string) int64 {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil && bad == nil {
			bad = errors.New("redis INFO: " + k + " is not a number: " + strconv.Quote(v))
		}
		return n
	}
	seen := 0
	parse(mem.Val(), func(k, v string) {
		switch k {
		case "used_memory":
			s.UsedMemory, seen = num(k, v), seen+1
		case "maxmemory":
			s.MaxMemory, seen = num(k, v), seen+1
		case "maxmemory_policy":
			s.Policy, seen = v, seen+1
		}
	})
	parse(stats.Val(), func(k, v string) {
		if k == "evicted_keys" {
			s.EvictedKeys, seen = num(k, v), seen+1
		}
	})
	if bad == nil && seen < 4 {
		bad = errors.New("redis INFO lacks used_memory, maxmemory, maxmemory_policy or evicted_keys")
	}
	return s, bad
}

// memoryWatch reads the memory of the store's Redis servers at start and
// then every interval, off the request path, keeps the latest reading, and
// tells the operator once about a set-up in which buckets can fill Redis
// or be evicted in the wrong order.
type memoryWatch struct {
	client  redis.UniversalClient
	log     *zap.Logger
	every   time.Duration
	timeout time.Duration // bounds one reading

	mu   sync.Mutex
	last RedisMemory
	ok   bool
	// told holds what has been logged once: a policy, or "nolimit".
	told map[string]bool
}

// newMemoryWatch returns a watch of client's memory that reads it every
// interval (a minute in production) once run; a nil log logs nothing.
func newMemoryWatch(client redis.UniversalClient, log *zap.Logger, every time.Duration) *memoryWatch {
	if log == nil {
		log = zap.NewNop()
	}
	return &memoryWatch{
		client:  client,
		log:     log,
		every:   every,
		timeout: 5 * time.Second,
		told:    make(map[string]bool),
	}
}

// Last returns the latest reading, and false before the first one
// succeeded.
func (w *memoryWatch) Last() (RedisMemory, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.ok
}

// run reads at once and then every interval until stop is closed, or until
// Redis refuses INFO to the user (an ACL without +info): that is said once,
// at info level, and the watch ends.
func (w *memoryWatch) run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	for {
		if !w.check(ctx) {
			return
		}
		select {
		case <-tick.C:
		case <-stop:
			return
		}
	}
}

// check takes one reading, keeps it and logs what it shows. It reports
// whether watching is worth going on with.
func (w *memoryWatch) check(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	m, err := ReadRedisMemory(ctx, w.client)
	if err != nil {
		if cmd, ok := noPermCommand(err); ok {
			w.log.Info("redis refuses INFO to this user, so its memory and eviction policy are not watched; grant the user +info to watch them",
				zap.String("redis_error", "NOPERM"), zap.String("command", cmd))
			return false
		}
		if ce := w.log.Check(zap.DebugLevel, "reading redis memory"); ce != nil {
			ce.Write(zap.Error(err))
		}
		return true
	}
	m.ReadAt = time.Now()
	w.mu.Lock()
	w.last, w.ok = m, true
	w.mu.Unlock()
	w.report(m)
	return true
}

// report logs, once per distinct finding, a set-up that does not suit
// buckets: no memory limit, noeviction, or an allkeys-* policy.
func (w *memoryWatch) report(m RedisMemory) {
	var unlimited []string
	byPolicy := map[string][]string{}
	for _, s := range m.Servers {
		switch {
		case s.MaxMemory == 0:
			unlimited = append(unlimited, s.Addr)
		case s.Policy == "noeviction", strings.HasPrefix(s.Policy, "allkeys-"):
			byPolicy[s.Policy] = append(byPolicy[s.Policy], s.Addr)
		}
	}
	if len(unlimited) > 0 && !w.told["nolimit"] {
		w.told["nolimit"] = true
		w.log.Info("redis has no maxmemory: it grows with the active buckets (and whatever else it holds) until the system runs out of memory; "+
			"setting maxmemory with maxmemory-policy volatile-ttl bounds it, and then Redis evicts the buckets nearest to full first",
			zap.Strings("servers", unlimited))
	}
	for _, policy := range slices.Sorted(maps.Keys(byPolicy)) {
		if w.told[policy] {
			continue
		}
		w.told[policy] = true
		why := "once used memory reaches maxmemory, Redis refuses every write, so every script call fails and each zone applies its on_error policy"
		if policy != "noeviction" {
			why = "Redis evicts keys regardless of their TTL, so it may drop busy buckets, which forgets charges and lets clients through again, before idle ones"
		}
		w.log.Warn("redis maxmemory-policy does not suit rate-limit buckets: "+why+"; "+
			"set maxmemory-policy volatile-ttl: every bucket key has a TTL equal to the time until the bucket is full again, "+
			"so volatile-ttl evicts the buckets whose loss forgets the least",
			zap.String("maxmemory_policy", policy), zap.Strings("servers", byPolicy[policy]))
	}
}

// IsOOM reports whether err, wrapped or not, is Redis refusing a write for
// want of memory ("OOM command not allowed when used memory > 'maxmemory'"):
// a command's own reply, a script refused up front (one with a shebang line
// and without allow-oom), or a script whose first write Redis refused, which
// Redis 7 reports as OOM with the script's location appended and Redis 6
// inside "ERR Error running script".
func IsOOM(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsOOMError(err) {
		return true
	}
	return strings.Contains(replyText(err), "OOM command not allowed")
}

// IsAuth reports whether err, wrapped or not, is Redis refusing the
// client's credentials (WRONGPASS, NOAUTH) or its permissions (NOPERM, or
// a command a script called that the user may not run). See noPermCommand
// for the command refused.
func IsAuth(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsAuthError(err) || redis.IsPermissionError(err) {
		return true
	}
	text := replyText(err)
	for _, code := range []string{"WRONGPASS ", "NOAUTH ", "NOPERM "} {
		if strings.HasPrefix(text, code) || strings.Contains(text, " -"+code) {
			return true
		}
	}
	return strings.Contains(text, scriptNoPerm)
}

// scriptNoPerm is how Redis (6.2 and 7) reports a command that a script
// called and the user may not run.
const scriptNoPerm = "The user executing the script can't run this command"

// RefusedCommand returns the command that a NOPERM error, wrapped or not,
// names, and whether err is one; "" for a command refused inside a script,
// which Redis does not name.
func RefusedCommand(err error) (string, bool) { return noPermCommand(err) }

// noPermCommand returns the command named by a NOPERM error ("NOPERM this
// user has no permissions to run the 'info' command"), wrapped or not, and
// whether err is one. For a command refused inside a script, which Redis
// does not name, the command is "".
func noPermCommand(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	text := replyText(err)
	i := strings.Index(text, "NOPERM ")
	if i < 0 {
		return "", strings.Contains(text, scriptNoPerm)
	}
	text = text[i:]
	if _, rest, ok := strings.Cut(text, "to run the '"); ok {
		if cmd, _, ok := strings.Cut(rest, "'"); ok {
			return cmd, true
		}
	}
	return "", true
}

// authCode returns the code of an authentication or permission error
// ("WRONGPASS", "NOAUTH" or "NOPERM", the last also for a command a script
// may not run), or "" when err is none of them: a short reason for logs and
// metrics that carries no secret.
func authCode(err error) string {
	if !IsAuth(err) {
		return ""
	}
	text := replyText(err)
	for _, code := range []string{"WRONGPASS", "NOAUTH", "NOPERM"} {
		if strings.Contains(text, code+" ") {
			return code
		}
	}
	return "NOPERM" // a script's command refused by the ACL
}

// replyText is the text of the Redis error reply inside err, or err's own
// text when it wraps none.
func replyText(err error) string {
	var re redis.Error
	if errors.As(err, &re) {
		return re.Error()
	}
	return err.Error()
}
