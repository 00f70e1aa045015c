package limiter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// RedisOptions configures a RedisStore. The topology follows from the
// addresses: SentinelMaster set means Sentinel; several addresses (or
// Cluster) mean a Redis Cluster; otherwise one server.
type RedisOptions struct {
	// Address is the Redis server's host:port (or a Cluster seed).
	Address string
	// Addresses are more servers: with Address, the seed nodes of a
	// Redis Cluster.
	Addresses []string
	// Cluster selects Redis Cluster even with a single seed address.
	Cluster bool
	// SentinelMaster is the name of the master that Sentinel monitors;
	// SentinelAddresses are the sentinels' host:port.
	SentinelMaster    string
	SentinelAddresses []string
	// SentinelUsername and SentinelPassword authenticate to the sentinels.
	SentinelUsername string
	SentinelPassword string
	// Username and Password authenticate (ACL user, or password alone).
	Username string
	Password string
	// DB is the database number (not in Cluster mode).
	DB int
	// TLS, when set, is the TLS configuration of every connection.
	TLS *tls.Config
	// Protocol is the RESP version, 2 or 3. Default 3 (go-redis falls back
	// to 2 when the server does not speak 3).
	Protocol int
	// DisableIdentity skips CLIENT SETINFO on connect, for proxies and
	// managed services that reject it.
	DisableIdentity bool
	// KeyPrefix starts every bucket key. Default "rl:".
	KeyPrefix string
	// Timeout bounds one decision, queueing included, in the time this
	// node was able to run: a node whose CPUs are saturated reads Redis'
	// replies late, and waits for them rather than taking the failure
	// policy, up to MaxWait. Default 25ms.
	Timeout time.Duration
	// MaxWait bounds a decision's wait in wall time, however starved the
	// node: the hard cap, once the node has run for Timeout since the
	// decision began (a frozen process first reads what waits in its
	// sockets); never more than twice MaxWait. Default 1s (at least
	// Timeout). See patience.go.
	MaxWait time.Duration
	// DialTimeout bounds opening a connection. Default 1s.
	DialTimeout time.Duration
	// Pipelines is how many round trips may be in flight at once; every
	// decision that arrives while they are busy joins the next one, in one
	// script call. Default 1: the most decisions share each round trip
	// and script call (about twenty at 50 connections to a local Redis),
	// which costs the least CPU on the node and in Redis; a decision waits
	// at most one round trip more. More suit a distant Redis, where that
	// wait is long.
	Pipelines int
	// PoolSize is the most connections per server. Default Pipelines+2.
	PoolSize int
	// BreakerFailures is how many consecutive failed round trips (however
	// many decisions each carried) open the circuit breaker. Default 5.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker keeps decisions away
	// from Redis before one probe may close it. Default 1s.
	BreakerCooldown time.Duration
	// Log receives the store's reports about Redis itself: its memory
	// policy, refused credentials. Default: none.
	Log *zap.Logger
	// Clock, when set, fixes the scripts' time (microseconds) for tests.
	// Production leaves it nil: the clock is then Redis TIME, the same for
	// every node whatever their own clocks say.
	Clock func() int64
}

// addrs returns every address of the options.
func (o *RedisOptions) addrs() []string {
	var all []string
	if o.Address != "" {
		all = append(all, o.Address)
	}
	return append(all, o.Addresses...)
}

// maxBatch bounds how many decisions share one round trip.
const maxBatch = 256

// RedisStore keeps buckets in Redis, so that every node pointed at the same
// Redis shares them. Decisions made concurrently share round trips and
// script calls (automatic pipelining): a few workers each take every
// decision queued and send them as one EVALSHA of the decide script (one
// per slot in a Cluster), which decides them one after the other, each
// against all zones of its request.
type RedisStore struct {
	client  redis.UniversalClient
	cluster bool
	prefix  string
	timeout time.Duration
	maxWait time.Duration
	clock   func() int64
	stall   *stallClock
	script  *redis.Script
	refund  *redis.Script
	breaker *Breaker
	memory  *memoryWatch
	log     *zap.Logger
	// errTimeout is the error of a decision that ran out of time.
	errTimeout error
	// trips numbers the round trips; lastFailed is the last failure token
	// (see failureToken) counted by the breaker.
	trips, lastFailed atomic.Uint64
	// flights holds, per pipeline worker, the round trip it has in flight.
	flights []atomic.Pointer[flight]
	// slow remembers the slowest round trips lately (see patience.go).
	slow slowTrips
	// extended counts decisions that waited past the timeout because this
	// node was starved, or Redis was answering slowly but answering.
	extended atomic.Uint64

	queue  chan *call
	stop   chan struct{}
	warmed chan struct{} // closed when the start-up connection attempt ends
	wg     sync.WaitGroup
}

// call is one script call travelling to a pipeline worker and back.
type call struct {
	script *redis.Script
	keys   []string // per zone: its bucket, rule and cost
	rules  []*Rule
	costs  []int64
	reply  []any
	err    error
	done   chan struct{}

	// trip numbers the round trip that carried the call (0 until one
	// does), for the circuit breaker.
	trip atomic.Uint64

	// For calls from the pool (see decideOne): who is done with it last
	// returns it. 0 pending, 1 delivered to a waiting caller, 2 abandoned
	// by a caller that gave up (the worker then returns it).
	state  atomic.Uint32
	pooled bool
	timer  *time.Timer
}

// callPool recycles the calls of single-call decisions, with their
// channel, timer and slices.
var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1), pooled: true} }}

// deliver hands a finished call back to its caller, or to the pool if the
// caller gave up on it.
func (c *call) deliver() {
	if !c.pooled || c.state.CompareAndSwap(0, 1) {
		c.done <- struct{}{}
		return
	}
	putCall(c)
}

func putCall(c *call) {
	clear(c.keys)
	clear(c.rules)
	c.keys, c.rules, c.costs, c.reply, c.err, c.script = c.keys[:0], c.rules[:0], c.costs[:0], nil, nil, nil
	c.state.Store(0)
	c.trip.Store(0)
	callPool.Put(c)
}

// NewRedisStore connects lazily to Redis and starts the pipeline workers;
// Close stops them. It fails only on invalid options: an unreachable Redis
// is a decision-time error, handled by the failure policy.
func NewRedisStore(opt RedisOptions) (*RedisStore, error) {
	addrs := opt.addrs()
	switch {
	case opt.SentinelMaster != "" && len(opt.SentinelAddresses) == 0:
		return nil, errors.New("redis sentinel needs at least one sentinel address")
	case opt.SentinelMaster != "" && len(addrs) > 0:
		return nil, errors.New("redis: give either sentinels or server addresses, not both")
	case opt.SentinelMaster == "" && len(addrs) == 0:
		return nil, errors.New("redis address is required")
	case opt.Protocol != 0 && opt.Protocol != 2 && opt.Protocol != 3:
		return nil, fmt.Errorf("redis protocol must be 2 or 3, not %d", opt.Protocol)
	}
	cluster := opt.SentinelMaster == "" && (opt.Cluster || len(addrs) > 1)
	if cluster && opt.DB != 0 {
		return nil, errors.New("redis cluster has only database 0")
	}
	if opt.KeyPrefix == "" {
		opt.KeyPrefix = "rl:"
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 25 * time.Millisecond
	}
	if opt.MaxWait <= 0 {
		opt.MaxWait = time.Second
	}
	opt.MaxWait = max(opt.MaxWait, opt.Timeout)
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = time.Second
	}
	if opt.Pipelines <= 0 {
		opt.Pipelines = 1
	}
	if opt.PoolSize <= 0 {
		opt.PoolSize = opt.Pipelines + 2
	}
	if opt.SentinelMaster != "" {
		addrs = opt.SentinelAddresses // go-redis takes the sentinels as Addrs
	}
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:            addrs,
		IsClusterMode:    cluster,
		MasterName:       opt.SentinelMaster,
		SentinelUsername: opt.SentinelUsername,
		SentinelPassword: opt.SentinelPassword,
		Username:         opt.Username,
		Password:         opt.Password,
		DB:               opt.DB,
		TLSConfig:        opt.TLS,
		Protocol:         opt.Protocol,
		DisableIdentity:  opt.DisableIdentity,
		DialTimeout:      opt.DialTimeout,
		// Fail at once when Redis refuses connections: the failure policy,
		// not a dial loop, decides what happens meanwhile.
		DialerRetries: 1,
		// A round trip's sockets wait up to the hard cap: on a starved
		// node a reply that Redis sent in time is read late, and a read
		// cut off by a short deadline would lose a decision Redis made.
		// The callers judge the timeout themselves (see waitFor).
		ReadTimeout:           2 * opt.MaxWait,
		WriteTimeout:          2 * opt.MaxWait,
		ContextTimeoutEnabled: true,
		// A retried EVALSHA could charge a bucket twice. (Cluster
		// redirections, MOVED and ASK, are not retries: the command did
		// not run.)
		MaxRetries:       -1,
		PoolSize:         opt.PoolSize,
		PipelinePoolSize: opt.PoolSize,
	})
	s := &RedisStore{
		client:     client,
		prefix:     opt.KeyPrefix,
		timeout:    opt.Timeout,
		maxWait:    opt.MaxWait,
		clock:      opt.Clock,
		stall:      newStallClock(),
		flights:    make([]atomic.Pointer[flight], opt.Pipelines),
		cluster:    cluster,
		script:     redis.NewScript(lua.Decide),
		refund:     redis.NewScript(lua.Refund),
		breaker:    NewBreaker(opt.BreakerFailures, opt.BreakerCooldown),
		log:        opt.Log,
		errTimeout: fmt.Errorf("%w (%s)", ErrStoreTimeout, opt.Timeout),
		queue:      make(chan *call, 4096),
		warmed:     make(chan struct{}),
		stop:       make(chan struct{}),
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	for i := range opt.Pipelines {
		s.wg.Add(1)
		go s.worker(&s.flights[i])
	}
	// Redis' memory, read off the request path: a policy that lets the
	// buckets fill it to OOM is warned of.
	s.memory = newMemoryWatch(client, s.log, time.Minute)
	s.wg.Go(func() { s.memory.run(s.stop) })
	// Connect and load the scripts now, in the background, so that the
	// first requests do not pay for a dial, a TLS handshake and a NOSCRIPT
	// round trip within their timeout. A failure here is harmless: the
	// decisions dial and load again.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(s.warmed)
		ctx, cancel := context.WithTimeout(context.Background(), opt.DialTimeout+opt.Timeout)
		defer cancel()
		go func() {
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := checkCredentials(ctx, s.client); errors.Is(err, ErrRedisCredentials) {
			s.log.Error("redis refuses the rate limit store's credentials; every decision fails and takes its zone's on_error policy",
				zap.Error(err))
		}
		pipe := s.client.Pipeline()
		pipe.ScriptLoad(ctx, lua.Decide)
		pipe.ScriptLoad(ctx, lua.Refund)
		_, _ = pipe.Exec(ctx)
		_ = s.script.Load(ctx, s.client).Err()
		_ = s.refund.Load(ctx, s.client).Err()
	}()
	return s, nil
}

// Client returns the underlying go-redis client.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

// Key returns the Redis key of a zone's bucket for a client key: the prefix,
// the zone, and the client key inside a Cluster hash tag, so that all of a
// client's buckets in one zone share a slot. ClientKey guarantees the client
// key holds no brace.
func (s *RedisStore) Key(zone, clientKey string) string {
	return s.prefix + zone + ":{" + clientKey + "}"
}

// Memory returns the latest reading of Redis' memory, and false before the
// first (or when INFO is not allowed).
func (s *RedisStore) Memory() (RedisMemory, bool) { return s.memory.Last() }

// Breaker returns the store's circuit breaker.
func (s *RedisStore) Breaker() *Breaker { return s.breaker }

// Decide implements Store. While the circuit breaker is open it fails at
// once with ErrBreakerOpen.
func (s *RedisStore) Decide(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	allowed, probe := s.breaker.allow()
	if !allowed {
		return false, ErrBreakerOpen
	}
	ok, token, err := s.decide(ctx, reqs, results)
	var refused *requestError
	switch {
	case err == nil:
		s.breaker.Success()
	case errors.Is(err, context.Canceled): // a client that left is not Redis' fault
		if probe {
			s.breaker.abandonProbe()
		}
	case errors.As(err, &refused): // Redis answered: it is up
		s.breaker.Success()
	case s.firstReport(token), probe:
		// The breaker counts failed round trips, not the decisions they
		// carried, so that one slow round trip of many decisions does not
		// open it: a stalled round trip counts once per timeout it
		// overran, and a decision that gave up while this node, not
		// Redis, was slow counts not at all (see failureToken). A probe's
		// failure always counts.
		s.breaker.Failure()
	}
	return ok, err
}

// firstReport reports whether token names a failure newer than any
// reported before: each counts once, and a late report of an older one not
// at all.
func (s *RedisStore) firstReport(token uint64) bool {
	for token != 0 {
		last := s.lastFailed.Load()
		if token <= last {
			return false
		}
		if s.lastFailed.CompareAndSwap(last, token) {
			return true
		}
	}
	return false
}

// Extended returns how many decisions waited past the timeout because this
// node was too starved of CPU to read Redis' replies in time.
func (s *RedisStore) Extended() uint64 { return s.extended.Load() }

// requestError is the error of one request of a batch whose commands
// failed (a bucket key holding another type, say) while Redis decided the
// rest of the batch: the request's failure policy applies, but Redis is up,
// so the circuit breaker does not count it.
type requestError struct{ err error }

func (e *requestError) Error() string { return "redis: " + e.err.Error() }
func (e *requestError) Unwrap() error { return e.err }

// decide returns the decision, and with an error its failure token (see
// failureToken; 0: not the store's failure).
func (s *RedisStore) decide(ctx context.Context, reqs []Request, results []Result) (bool, uint64, error) {
	if !s.cluster || len(reqs) == 1 {
		return s.decideOne(ctx, reqs, results)
	}
	ctx, cancel := s.timeoutContext(ctx)
	defer cancel()
	ok, err := s.decideBySlot(ctx, reqs, results)
	if err != nil {
		return ok, s.trips.Add(1)<<16 | tripFailed, err // several round trips: count it as one more
	}
	return ok, 0, nil
}

// timeoutContext returns a context that ends when the decision has waited
// Timeout in the time this node was able to run, or MaxWait in all (see
// extension); its cause is then the store's timeout error.
func (s *RedisStore) timeoutContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	start := s.stall.mark()
	var t *time.Timer
	t = time.AfterFunc(s.timeout, func() {
		if wait := s.extension(start, 0); wait > 0 {
			t.Reset(wait)
			return
		}
		cancel(s.errTimeout)
	})
	return ctx, func() { t.Stop(); cancel(context.Canceled) }
}

// decideOne decides a request in one script call: the common path, so it
// recycles its call (channel, timer, slices) and bounds the wait with the
// call's own timer rather than a new context per decision. It looks at ctx
// only before it starts: a request whose client leaves meanwhile waits at
// most the timeout, and watching ctx would cost every decision a channel.
func (s *RedisStore) decideOne(ctx context.Context, reqs []Request, results []Result) (bool, uint64, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	c := callPool.Get().(*call)
	s.fill(c, s.script, reqs, nil)
	start := s.stall.mark()
	if c.timer == nil {
		c.timer = time.NewTimer(s.timeout)
	} else {
		c.timer.Reset(s.timeout)
	}
	extended := false
	select {
	case s.queue <- c:
	default: // the queue is full: wait for room, within the timeout
	enqueue:
		for {
			select {
			case s.queue <- c:
				break enqueue
			case <-c.timer.C:
				if wait := s.extension(start, 0); wait > 0 {
					extended = true
					c.timer.Reset(wait)
					continue
				}
				putCall(c)
				return false, 0, s.errTimeout
			}
		}
	}
	var gaveUp error
wait:
	for {
		select {
		case <-c.done:
			c.timer.Stop()
			break wait
		case <-c.timer.C:
			if wait := s.extension(start, c.trip.Load()); wait > 0 {
				extended = true
				c.timer.Reset(wait)
				continue
			}
			gaveUp = s.errTimeout
			break wait
		}
	}
	if extended {
		s.extended.Add(1)
	}
	if gaveUp != nil {
		token := s.failureToken(c.trip.Load()) // before the call may go back to the pool
		if c.state.CompareAndSwap(0, 2) {
			return false, token, gaveUp // the worker returns the call to the pool
		}
		<-c.done // delivered as we gave up: use it
	}
	defer putCall(c)
	if c.err != nil {
		return false, c.trip.Load()<<16 | tripFailed, c.err
	}
	ok, err := decodeReply(c.reply, reqs, results)
	return ok, 0, err
}

// decideBySlot decides a request whose zones' buckets may sit on several
// Cluster slots: one script call per slot, all in one pipeline. When one
// slot denies, the slots that admitted (and so charged) are refunded, so
// that a denied request is charged to no zone. Between the charge and the
// refund another request may find those buckets emptier than they will
// be: a refund can cause a denial, never an admission beyond the limit.
func (s *RedisStore) decideBySlot(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	var slotBuf [8]int
	slots := slotBuf[:0]
	for i := range reqs {
		slots = append(slots, keySlot(s.Key(reqs[i].Rule.Bucket, reqs[i].Key)))
	}
	// Group the zones by slot, keeping each group in request order.
	var groups [][]int
	for i, sl := range slots {
		placed := false
		for g := range groups {
			if slots[groups[g][0]] == sl {
				groups[g] = append(groups[g], i)
				placed = true
				break
			}
		}
		if !placed {
			groups = append(groups, []int{i})
		}
	}
	if len(groups) == 1 {
		c := s.newCall(s.script, reqs, nil)
		if err := s.send(ctx, c); err != nil {
			return false, err
		}
		return decodeReply(c.reply, reqs, results)
	}
	calls := make([]*call, len(groups))
	for g, idx := range groups {
		calls[g] = s.newCall(s.script, reqs, idx)
	}
	errs := s.sendAll(ctx, calls)
	admitted := make([]bool, len(groups))
	all := true
	var firstErr error
	for g, idx := range groups {
		if errs[g] != nil {
			all = false
			firstErr = orErr(firstErr, errs[g])
			continue
		}
		sub := subset(reqs, idx)
		subRes := make([]Result, len(idx))
		ok, err := decodeReply(calls[g].reply, sub, subRes)
		if err != nil {
			all = false
			firstErr = orErr(firstErr, err)
			continue
		}
		admitted[g] = ok
		all = all && ok
		for j, i := range idx {
			results[i] = subRes[j]
		}
	}
	if all {
		return true, nil
	}
	// Give back what the admitting slots charged, and report their zones
	// as not charged.
	var refunds []*call
	for g, idx := range groups {
		if !admitted[g] {
			continue
		}
		refunds = append(refunds, s.newCall(s.refund, reqs, idx))
		sub := subset(reqs, idx)
		subRes := make([]Result, len(idx))
		if _, err := decodeReplyAs(calls[g].reply, sub, subRes, false); err == nil {
			for j, i := range idx {
				results[i] = subRes[j]
			}
		}
	}
	for _, err := range s.sendAll(ctx, refunds) {
		firstErr = orErr(firstErr, err)
	}
	if firstErr != nil {
		return false, firstErr
	}
	return false, nil
}

// orErr keeps the first error.
func orErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func subset(reqs []Request, idx []int) []Request {
	sub := make([]Request, len(idx))
	for j, i := range idx {
		sub[j] = reqs[i]
	}
	return sub
}

// newCall prepares a call of script (decide or refund) for the zones idx of
// reqs (all zones when idx is nil): per zone the algorithm, its four
// parameters and the cost.
func (s *RedisStore) newCall(script *redis.Script, reqs []Request, idx []int) *call {
	c := &call{done: make(chan struct{}, 1)}
	s.fill(c, script, reqs, idx)
	return c
}

// fill sets a call's script, and per zone its key, rule and cost.
func (s *RedisStore) fill(c *call, script *redis.Script, reqs []Request, idx []int) {
	c.script = script
	c.keys, c.rules, c.costs = c.keys[:0], c.rules[:0], c.costs[:0]
	add := func(q *Request) {
		c.keys = append(c.keys, s.Key(q.Rule.Bucket, q.Key))
		c.rules = append(c.rules, q.Rule)
		c.costs = append(c.costs, q.Cost)
	}
	if idx == nil {
		for i := range reqs {
			add(&reqs[i])
		}
	} else {
		for _, i := range idx {
			add(&reqs[i])
		}
	}
}

// send queues one call for the pipeline workers and waits for its reply.
func (s *RedisStore) send(ctx context.Context, c *call) error {
	select {
	case s.queue <- c:
	case <-ctx.Done():
		return s.ctxErr(ctx)
	}
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return s.ctxErr(ctx)
	}
}

// sendAll queues calls together, so that they share a pipeline, and waits
// for every reply.
func (s *RedisStore) sendAll(ctx context.Context, calls []*call) []error {
	errs := make([]error, len(calls))
	queued := 0
	for _, c := range calls {
		select {
		case s.queue <- c:
			queued++
		case <-ctx.Done():
		}
	}
	for i, c := range calls {
		if i >= queued {
			errs[i] = s.ctxErr(ctx)
			continue
		}
		select {
		case <-c.done:
			errs[i] = c.err
		case <-ctx.Done():
			errs[i] = s.ctxErr(ctx)
		}
	}
	return errs
}

// Ping checks that Redis answers.
func (s *RedisStore) Ping(ctx context.Context) error {
	return s.client.Ping(ctx).Err()
}

// Close stops the workers and closes the connections.
func (s *RedisStore) Close() error {
	close(s.stop)
	s.wg.Wait()
	s.stall.close()
	return s.client.Close()
}

func (s *RedisStore) ctxErr(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrStoreTimeout) {
		return cause
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return s.errTimeout
	}
	return ctx.Err()
}

func (s *RedisStore) worker(inFlight *atomic.Pointer[flight]) {
	defer s.wg.Done()
	batch := make([]*call, 0, maxBatch)
	var p pipeline
	for {
		select {
		case c := <-s.queue:
			batch = append(batch[:0], c)
		case <-s.stop:
			return
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case c := <-s.queue:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		s.run(&p, batch, inFlight)
		clear(batch)
	}
}

// scriptCall is one EVALSHA of a pipeline: the decide script for a batch
// of calls (every waiting decision, or in a Cluster those of one slot), or
// the refund script for one call.
type scriptCall struct {
	script *redis.Script
	calls  []*call
	cmd    *redis.Cmd
}

// pipeline is a worker's reusable grouping of a batch into script calls.
type pipeline struct {
	groups []scriptCall
	slots  map[int]int // Cluster: slot to index in groups
	rules  []*Rule     // a script call's distinct rules
	keys   []string    // a script call's distinct buckets
	// buckets maps a script call's buckets to their index in keys, from 1.
	buckets map[string]int
	// zones holds, per zone of the script call's calls in order, the index
	// of its rule and of its bucket (from 1).
	zones []int
}

// group sorts a batch into script calls: the decisions into one (per slot
// in a Cluster, where a script's keys must share a slot), each refund into
// its own.
func (s *RedisStore) group(p *pipeline, batch []*call) []scriptCall {
	for i := range p.groups {
		clear(p.groups[i].calls)
		p.groups[i] = scriptCall{calls: p.groups[i].calls[:0]}
	}
	p.groups = p.groups[:0]
	if s.cluster {
		if p.slots == nil {
			p.slots = make(map[int]int)
		}
		clear(p.slots)
	}
	add := func(script *redis.Script, c *call) int {
		if len(p.groups) < cap(p.groups) {
			p.groups = p.groups[:len(p.groups)+1]
		} else {
			p.groups = append(p.groups, scriptCall{})
		}
		g := &p.groups[len(p.groups)-1]
		g.script, g.calls = script, append(g.calls, c)
		return len(p.groups) - 1
	}
	decide := -1
	for _, c := range batch {
		switch {
		case c.script == s.refund:
			add(s.refund, c)
		case s.cluster:
			slot := keySlot(c.keys[0])
			if g, ok := p.slots[slot]; ok {
				p.groups[g].calls = append(p.groups[g].calls, c)
			} else {
				p.slots[slot] = add(s.script, c)
			}
		case decide >= 0:
			p.groups[decide].calls = append(p.groups[decide].calls, c)
		default:
			decide = add(s.script, c)
		}
	}
	return p.groups
}

// run sends a batch in one pipeline. A pipelined EVALSHA cannot fall back to
// EVAL by itself, so script calls answered NOSCRIPT (Redis restarted,
// failed over, or SCRIPT FLUSH) are sent again once their script is loaded:
// NOSCRIPT means the script did not run, so nothing is charged twice. So
// are those answered TRYAGAIN (a Cluster slot in migration), after a short
// pause.
func (s *RedisStore) run(p *pipeline, batch []*call, inFlight *atomic.Pointer[flight]) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.maxWait)
	defer cancel()
	// Calls whose callers gave up waiting in the queue are not sent: their
	// requests already took the failure policy.
	live := batch[:0]
	for _, c := range batch {
		if c.pooled && c.state.Load() == 2 {
			putCall(c)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	batch = live
	trip := s.trips.Add(1)
	for _, c := range batch {
		c.trip.Store(trip)
	}
	left := s.stall.mark()
	inFlight.Store(&flight{trip: trip, left: left})
	defer inFlight.Store(nil)
	groups := s.group(p, batch)
	s.exec(ctx, p, groups)
	s.timeTrip(left, groups)
	var again []scriptCall
	for attempt := 0; attempt < 3; attempt++ {
		var pos []int
		var load []*redis.Script
		tryAgain := false
		again = again[:0]
		for i := range groups {
			switch err := groups[i].cmd.Err(); {
			case isNoScript(err):
				again, pos = append(again, groups[i]), append(pos, i)
				if !containsScript(load, groups[i].script) {
					load = append(load, groups[i].script)
				}
			case redis.IsTryAgainError(err):
				again, pos = append(again, groups[i]), append(pos, i)
				tryAgain = true
			}
		}
		if len(again) == 0 {
			break
		}
		for _, sc := range load {
			if err := sc.Load(ctx, s.client).Err(); err != nil {
				again = again[:0] // report the NOSCRIPT errors as they are
			}
		}
		if len(again) == 0 {
			break
		}
		if tryAgain {
			select {
			case <-time.After(2 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		s.exec(ctx, p, again)
		for j, i := range pos {
			groups[i].cmd = again[j].cmd
		}
	}
	for i := range groups {
		s.deliver(&groups[i])
	}
}

// timeTrip records how long a round trip that left at left took, when
// Redis answered it (an answer that is an error reply counts; a failed
// connection or a timeout does not: a hung Redis must not teach the store
// to wait longer for it).
func (s *RedisStore) timeTrip(left stallMark, groups []scriptCall) {
	for i := range groups {
		if err := groups[i].cmd.Err(); err != nil {
			var reply redis.Error
			if !errors.As(err, &reply) {
				return
			}
		}
	}
	took, _ := s.stall.since(left)
	s.slow.add(took, left.at+int64(took))
}

// deliver hands each call of a script call its part of the reply, or the
// error.
func (s *RedisStore) deliver(g *scriptCall) {
	if g.script == s.refund {
		c := g.calls[0]
		if c.err = g.cmd.Err(); c.err != nil {
			c.err = s.cmdErr(c.err)
		}
		c.deliver()
		return
	}
	reply, err := g.cmd.Slice()
	if err != nil {
		err = s.cmdErr(err)
	}
	o := 0
	for _, c := range g.calls {
		w := 1 + 4*len(c.keys)
		switch {
		case err != nil:
			c.err = err
		case o+w > len(reply):
			c.err = fmt.Errorf("redis: unexpected script reply of %d values for %d zones in %d requests", len(reply), len(c.keys), len(g.calls))
		default:
			if e, ok := reply[o].(error); ok {
				c.err = &requestError{e}
			} else {
				c.reply = reply[o : o+w : o+w]
			}
		}
		o += w
		c.deliver() // the last use of c: it may go back to the pool
	}
}

func containsScript(list []*redis.Script, sc *redis.Script) bool {
	for _, x := range list {
		if x == sc {
			return true
		}
	}
	return false
}

// cmdErr wraps a command's error. A socket deadline or the batch's context
// running out is a timeout like the caller's own, so it is ErrStoreTimeout
// too: whichever fires first, callers can tell a hung Redis apart.
func (s *RedisStore) cmdErr(err error) error {
	var ne net.Error // context.DeadlineExceeded is one as well
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w (%s): redis: %w", ErrStoreTimeout, 2*s.maxWait, err)
	}
	return fmt.Errorf("redis: %w", err)
}

// exec sends script calls in one pipeline and sets each one's command:
// EVALSHA, the distinct buckets of all its calls, the clock, the rules they
// use (each once), then per call its number of zones and per zone its
// rule's index, its bucket's index and its cost. See decide.lua.
func (s *RedisStore) exec(ctx context.Context, p *pipeline, groups []scriptCall) {
	clock := "0"
	if s.clock != nil {
		clock = strconv.FormatInt(s.clock(), 10)
	}
	if p.buckets == nil {
		p.buckets = make(map[string]int)
	}
	pipe := s.client.Pipeline()
	for i := range groups {
		g := &groups[i]
		rules, keys, zones := p.rules[:0], p.keys[:0], p.zones[:0]
		clear(p.buckets)
		for _, c := range g.calls {
			for z, r := range c.rules {
				ri := slices.Index(rules, r)
				if ri < 0 {
					rules = append(rules, r)
					ri = len(rules) - 1
				}
				ki, ok := p.buckets[c.keys[z]]
				if !ok {
					keys = append(keys, c.keys[z])
					ki = len(keys)
					p.buckets[c.keys[z]] = ki
				}
				zones = append(zones, ri+1, ki)
			}
		}
		args := make([]any, 0, 5+len(keys)+5*len(rules)+len(g.calls)+3*len(zones)/2)
		args = append(args, "evalsha", g.script.Hash(), len(keys))
		for _, k := range keys {
			args = append(args, k)
		}
		args = append(args, clock, len(rules))
		for _, r := range rules {
			args = append(args, r.scriptArgs()...)
		}
		next := zones
		for _, c := range g.calls {
			args = append(args, len(c.keys))
			for _, cost := range c.costs {
				args = append(args, next[0], next[1], cost)
				next = next[2:]
			}
		}
		clear(rules)
		clear(keys)
		p.rules, p.keys, p.zones = rules[:0], keys[:0], zones[:0]
		g.cmd = redis.NewCmd(ctx, args...)
		_ = pipe.Process(ctx, g.cmd)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// Each command carries its own error, except when the connection
		// failed its set-up with a Redis reply (AUTH or HELLO refused:
		// WRONGPASS, NOAUTH): go-redis then sets it on no command, which
		// would read as an empty reply. A command that was answered never
		// has neither value nor error (a nil reply is redis.Nil).
		for i := range groups {
			if cmd := groups[i].cmd; cmd.Err() == nil && cmd.Val() == nil {
				cmd.SetErr(err)
			}
		}
	}
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// decodeReply turns the script's reply into results, through the same
// Rule.result as the memory store.
func decodeReply(reply []any, reqs []Request, results []Result) (bool, error) {
	return decodeReplyAs(reply, reqs, results, true)
}

// decodeReplyAs is decodeReply; with charged false it reports every zone as
// not charged (the request was refunded).
func decodeReplyAs(reply []any, reqs []Request, results []Result, charged bool) (bool, error) {
	if len(reply) != 1+4*len(reqs) {
		return false, fmt.Errorf("redis: unexpected script reply of %d values for %d zones", len(reply), len(reqs))
	}
	admit := false
	if n, ok := reply[0].(int64); ok {
		admit = n == 1
	}
	var vals [4]int64
	for i := range reqs {
		for j := range 4 {
			n, ok := reply[1+4*i+j].(int64)
			if !ok {
				return false, fmt.Errorf("redis: unexpected script reply value %T", reply[1+4*i+j])
			}
			vals[j] = n
		}
		r := reqs[i].Rule
		results[i] = r.result(r.fromReply(vals), admit && charged, reqs[i].Cost)
	}
	return admit, nil
}

// Interface guard.
var _ Store = (*RedisStore)(nil)
