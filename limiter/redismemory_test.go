package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// newRedisClient returns a go-redis client of addr closed when the test
// ends.
func newRedisClient(t *testing.T, opt *redis.Options) *redis.Client {
	t.Helper()
	if opt.DialTimeout == 0 {
		opt.DialTimeout = 5 * time.Second
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// fillRedis writes about n bytes of keys without a TTL.
func fillRedis(t *testing.T, srv *redistest.Server, n int) {
	t.Helper()
	srv.MustDo("EVAL", "for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'fill:' .. i, string.rep('x', 100)) end return 1",
		"0", fmt.Sprint(n/100))
}

// outOfMemory fills srv and then lowers its maxmemory below its use, with
// noeviction, so that every write is refused.
func outOfMemory(t *testing.T, srv *redistest.Server) {
	t.Helper()
	fillRedis(t, srv, 4<<20)
	srv.MustDo("CONFIG", "SET", "maxmemory-policy", "noeviction")
	srv.MustDo("CONFIG", "SET", "maxmemory", "2mb")
}

func TestReadRedisMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", "20mb", "--maxmemory-policy", "volatile-ttl")
	c := newRedisClient(t, &redis.Options{Addr: srv.Addr})
	ctx := context.Background()
	m, err := ReadRedisMemory(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Servers) != 1 {
		t.Fatalf("Servers = %+v, want one", m.Servers)
	}
	s := m.Servers[0]
	if s.Addr != srv.Addr || s.MaxMemory != 20<<20 || s.Policy != "volatile-ttl" || s.UsedMemory <= 0 || s.EvictedKeys != 0 {
		t.Fatalf("reading = %+v, want %s with maxmemory 20mb, volatile-ttl, some memory used, nothing evicted", s, srv.Addr)
	}
	if m.MaxMemory != s.MaxMemory || m.UsedMemory != s.UsedMemory || m.EvictedKeys != 0 {
		t.Fatalf("sums = %+v, want the one server's", m)
	}

	// Evictions are counted: fill a small Redis with keys that have a TTL.
	srv.MustDo("CONFIG", "SET", "maxmemory", "2mb")
	srv.MustDo("EVAL", "for i = 1, 40000 do redis.call('SET', 'ttl:' .. i, string.rep('x', 100), 'EX', 3600) end return 1", "0")
	m, err = ReadRedisMemory(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if m.EvictedKeys == 0 || m.MaxMemory != 2<<20 {
		t.Fatalf("after filling a 2mb Redis: %+v, want evictions counted", m)
	}
}

func TestReadRedisMemoryCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--maxmemory", "30mb", "--maxmemory-policy", "volatile-ttl")
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	m, err := ReadRedisMemory(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Servers) != 3 {
		t.Fatalf("Servers = %+v, want the three masters", m.Servers)
	}
	var used int64
	for i, s := range m.Servers {
		if s.MaxMemory != 30<<20 || s.Policy != "volatile-ttl" || s.UsedMemory <= 0 || s.Addr == "" {
			t.Fatalf("server %d = %+v", i, s)
		}
		if i > 0 && m.Servers[i-1].Addr >= s.Addr {
			t.Fatalf("servers not ordered by address: %+v", m.Servers)
		}
		used += s.UsedMemory
	}
	if m.MaxMemory != 90<<20 || m.UsedMemory != used {
		t.Fatalf("sums = maxmemory %d, used %d; want %d and %d", m.MaxMemory, m.UsedMemory, 90<<20, used)
	}
}

// watchLogs runs a memory watch of c every few milliseconds and returns
// it with its logs; the watch stops when the test ends.
func watchLogs(t *testing.T, c redis.UniversalClient, level zapcore.Level) (*memoryWatch, *observer.ObservedLogs, chan struct{}) {
	t.Helper()
	core, logs := observer.New(level)
	w := newMemoryWatch(c, zap.New(core), 5*time.Millisecond)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		w.run(stop)
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	return w, logs, done
}

// waitReadings waits until w has taken n more readings than now.
func waitReadings(t *testing.T, w *memoryWatch, logs *observer.ObservedLogs, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	seen := 0
	var last RedisMemory
	for seen < n {
		if time.Now().After(deadline) {
			t.Fatalf("the watch took %d readings in 10s, want %d; logs: %v", seen, n, logs.All())
		}
		m, ok := w.Last()
		if ok && (seen == 0 || !sameReading(m, last)) {
			seen++
			last = m
		}
		time.Sleep(time.Millisecond)
	}
}

// sameReading compares readings by their slice, which every reading
// allocates anew.
func sameReading(a, b RedisMemory) bool {
	return len(a.Servers) > 0 && len(b.Servers) > 0 && &a.Servers[0] == &b.Servers[0]
}

func TestMemoryWatchPolicies(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-pw-never-logged"
	srv := redistest.Start(t, "--requirepass", secret, "--maxmemory", "20mb", "--maxmemory-policy", "noeviction")
	c := newRedisClient(t, &redis.Options{Addr: srv.Addr, Password: secret})
	w, logs, _ := watchLogs(t, c, zapcore.DebugLevel)
	waitReadings(t, w, logs, 3)

	warnings := func() []observer.LoggedEntry {
		return logs.FilterLevelExact(zapcore.WarnLevel).All()
	}
	if got := warnings(); len(got) != 1 {
		t.Fatalf("warnings after three readings with noeviction = %v, want one", got)
	}
	warn := warnings()[0]
	for _, want := range []string{"volatile-ttl", "TTL equal to the time until the bucket is full again", "on_error"} {
		if !strings.Contains(warn.Message, want) {
			t.Fatalf("warning %q does not say %q", warn.Message, want)
		}
	}
	if got := warn.ContextMap()["maxmemory_policy"]; got != "noeviction" {
		t.Fatalf("warning's policy = %v", got)
	}

	// Another policy that does not fit warns once more; one that fits
	// does not.
	srv.MustDo("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	waitReadings(t, w, logs, 3)
	srv.MustDo("CONFIG", "SET", "maxmemory-policy", "volatile-ttl")
	waitReadings(t, w, logs, 2)
	srv.MustDo("CONFIG", "SET", "maxmemory-policy", "noeviction") // told already
	waitReadings(t, w, logs, 2)
	got := warnings()
	if len(got) != 2 || got[1].ContextMap()["maxmemory_policy"] != "allkeys-lru" || !strings.Contains(got[1].Message, "regardless of their TTL") {
		t.Fatalf("warnings = %v, want noeviction's and then allkeys-lru's", got)
	}
	if m, ok := w.Last(); !ok || m.Servers[0].Policy != "noeviction" {
		t.Fatalf("Last() = %+v, %v", m, ok)
	}
	assertNoSecret(t, logs, secret)
}

func TestMemoryWatchNoLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t) // maxmemory 0 and noeviction: Redis' defaults
	c := newRedisClient(t, &redis.Options{Addr: srv.Addr})
	w, logs, _ := watchLogs(t, c, zapcore.DebugLevel)
	waitReadings(t, w, logs, 3)
	if got := logs.FilterLevelExact(zapcore.WarnLevel).All(); len(got) != 0 {
		t.Fatalf("warnings without maxmemory = %v, want none", got)
	}
	infos := logs.FilterLevelExact(zapcore.InfoLevel).All()
	if len(infos) != 1 || !strings.Contains(infos[0].Message, "no maxmemory") || !strings.Contains(infos[0].Message, "volatile-ttl") {
		t.Fatalf("info lines without maxmemory = %v, want one about it", infos)
	}
}

func TestMemoryWatchNoPerm(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.AddUser("limiter", "pw", "~rl:*", "+evalsha", "+ping", "+hello", "+auth")
	c := newRedisClient(t, &redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw"})
	w, logs, done := watchLogs(t, c, zapcore.DebugLevel)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the watch goes on although Redis refuses INFO; logs: %v", logs.All())
	}
	all := logs.All()
	if len(all) != 1 || all[0].Level != zapcore.InfoLevel || all[0].ContextMap()["command"] != "info" ||
		!strings.Contains(all[0].Message, "+info") {
		t.Fatalf("logs = %v, want one info line naming the info command", all)
	}
	if _, ok := w.Last(); ok {
		t.Fatal("Last() reports a reading that Redis refused")
	}
	assertNoSecret(t, logs, "pw")
}

func TestMemoryWatchWrongPassword(t *testing.T) {
	t.Parallel()
	const secret, wrong = "right-horse-battery", "wrong-staple-battery"
	srv := redistest.Start(t, "--requirepass", secret)
	c := newRedisClient(t, &redis.Options{Addr: srv.Addr, Password: wrong})
	w, logs, _ := watchLogs(t, c, zapcore.DebugLevel)
	deadline := time.Now().Add(10 * time.Second)
	for logs.Len() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("logs = %v, want a debug line per failed reading", logs.All())
		}
		time.Sleep(time.Millisecond)
	}
	for _, e := range logs.All() {
		if e.Level != zapcore.DebugLevel || !strings.Contains(fmt.Sprint(e.ContextMap()["error"]), "WRONGPASS") {
			t.Fatalf("log %v, want debug lines naming WRONGPASS", e)
		}
	}
	if _, ok := w.Last(); ok {
		t.Fatal("Last() reports a reading that Redis refused")
	}
	assertNoSecret(t, logs, secret)
	assertNoSecret(t, logs, wrong)
}

// assertNoSecret fails the test when any log message or field holds s.
func assertNoSecret(t *testing.T, logs *observer.ObservedLogs, s string) {
	t.Helper()
	for _, e := range logs.All() {
		if strings.Contains(e.Message, s) || strings.Contains(fmt.Sprint(e.ContextMap()), s) {
			t.Fatalf("a log line holds the password %q: %v", s, e)
		}
	}
}

// TestIsOOM classifies the errors a real Redis 7 returns when it is out of
// memory: a command's, a script whose first write is refused (unflagged,
// as the limiter's), a flagged script refused before it runs, and the
// store's own decision error.
func TestIsOOM(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newRedisClient(t, &redis.Options{Addr: srv.Addr})
	ctx := context.Background()
	store := newRedisStore(t, RedisOptions{Address: srv.Addr})
	rule := mustRule(t, "oom", 10, time.Second, 10)
	outOfMemory(t, srv)

	errs := map[string]error{}
	errs["SET"] = c.Set(ctx, "k", "v", 0).Err()
	errs["script writing"] = c.Eval(ctx, "redis.call('GET', KEYS[1]); return redis.call('SET', KEYS[1], 'v')", []string{"k"}).Err()
	errs["script with a shebang"] = c.Eval(ctx, "#!lua\nreturn redis.call('SET', KEYS[1], 'v')", []string{"k"}).Err()
	// A flagged script (a shebang line without allow-oom) is refused before
	// it runs, even one whose only write, DEL, would be allowed.
	errs["script with a shebang, refused up front"] = c.Eval(ctx, "#!lua\nreturn redis.call('DEL', KEYS[1])", []string{"fill:2"}).Err()
	if n := c.Exists(ctx, "fill:2").Val(); n != 1 {
		t.Errorf("the flagged script ran: fill:2 exists %d", n)
	}
	if n, err := c.Eval(ctx, "return redis.call('DEL', KEYS[1])", []string{"fill:3"}).Int(); n != 1 || err != nil {
		t.Errorf("an unflagged script's DEL when out of memory = %d, %v; want it to run", n, err)
	}
	results := make([]Result, 1)
	_, errs["store decision"] = store.Decide(ctx, []Request{{Rule: rule, Key: "203.0.113.1", Cost: 1}}, results)
	errs["wrapped"] = fmt.Errorf("deciding: %w", errs["SET"])
	for name, err := range errs {
		if !IsOOM(err) {
			t.Errorf("%s: IsOOM(%v) = false", name, err)
		}
		if IsAuth(err) {
			t.Errorf("%s: IsAuth(%v) = true", name, err)
		}
	}
	t.Logf("Redis' OOM replies: command %q; unflagged script %q; flagged script %q; store %q",
		errs["SET"], errs["script writing"], errs["script with a shebang"], errs["store decision"])
	if msg := errs["script writing"].Error(); !strings.HasPrefix(msg, "OOM command not allowed") || !strings.Contains(msg, "script: ") {
		t.Errorf("an unflagged script's OOM = %q; Redis 7 keeps the OOM code and appends the script", msg)
	}

	// Redis 6 wraps a script's error in ERR; reads still work when out of
	// memory, and other errors are not OOM.
	redis6 := errors.New("ERR Error running script (call to f_0123): @user_script:1: -OOM command not allowed when used memory > 'maxmemory'.")
	if !IsOOM(redis6) {
		t.Errorf("IsOOM(%v) = false", redis6)
	}
	if err := c.Get(ctx, "fill:1").Err(); err != nil {
		t.Fatalf("GET when out of memory: %v", err)
	}
	for _, err := range []error{nil, redis.Nil, context.DeadlineExceeded, c.LLen(ctx, "fill:1").Err(), c.EvalSha(ctx, probeSHA, nil).Err()} {
		if IsOOM(err) {
			t.Errorf("IsOOM(%v) = true", err)
		}
	}
}

// TestIsAuth classifies the errors a real Redis returns for a wrong
// password, no password and a user without a command's permission.
func TestIsAuth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.Start(t, "--requirepass", "pw")
	srv.AddUser("limiter", "pw2", "~rl:*", "+evalsha", "+script|load", "+ping", "+hello", "+auth", "+mget")

	cases := []struct {
		name, code, command string
		err                 error
	}{
		{"wrong password", "WRONGPASS", "", newRedisClient(t, &redis.Options{Addr: srv.Addr, Password: "nope"}).Ping(ctx).Err()},
		{"no password, RESP2", "NOAUTH", "", newRedisClient(t, &redis.Options{Addr: srv.Addr, Protocol: 2}).Ping(ctx).Err()},
		{"no password, RESP3", "NOAUTH", "", newRedisClient(t, &redis.Options{Addr: srv.Addr}).Ping(ctx).Err()},
		{"command refused", "NOPERM", "info", newRedisClient(t, &redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw2"}).Info(ctx, "memory").Err()},
	}
	limiterUser := newRedisClient(t, &redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw2"})
	sha, err := limiterUser.ScriptLoad(ctx, "return redis.call('SET', KEYS[1], 'v')").Result()
	if err != nil {
		t.Fatal(err)
	}
	cases = append(cases,
		struct {
			name, code, command string
			err                 error
		}{"a script's command refused", "NOPERM", "", limiterUser.EvalSha(ctx, sha, []string{"rl:a"}).Err()},
		struct {
			name, code, command string
			err                 error
		}{"a key refused", "NOPERM", "", limiterUser.EvalSha(ctx, sha, []string{"other"}).Err()},
	)
	for _, tc := range cases {
		err := fmt.Errorf("redis: %w", tc.err)
		if !IsAuth(err) {
			t.Errorf("%s: IsAuth(%v) = false", tc.name, err)
		}
		if got := authCode(err); got != tc.code {
			t.Errorf("%s: authCode(%v) = %q, want %q", tc.name, err, got, tc.code)
		}
		cmd, noPerm := noPermCommand(err)
		if noPerm != (tc.code == "NOPERM") || cmd != tc.command {
			t.Errorf("%s: noPermCommand(%v) = %q, %v; want %q, %v", tc.name, err, cmd, noPerm, tc.command, tc.code == "NOPERM")
		}
		if IsOOM(err) {
			t.Errorf("%s: IsOOM(%v) = true", tc.name, err)
		}
		t.Logf("%s: %v", tc.name, tc.err)
	}
	for _, err := range []error{nil, redis.Nil, errors.New("ERR unknown command 'x'"), limiterUser.EvalSha(ctx, probeSHA, nil).Err()} {
		if IsAuth(err) || authCode(err) != "" {
			t.Errorf("IsAuth(%v) = true", err)
		}
	}
}
