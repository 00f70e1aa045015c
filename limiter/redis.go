package limiter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
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
	// SentinelMaster is the name of the master that Sentinel monitors.
	// Setting it selects Sentinel: the store then asks the sentinels for
	// the master, and Address and Addresses must be empty. Default "": no
	// Sentinel.
	SentinelMaster string
	// SentinelAddresses are the sentinels' host:port; at least one is
	// required when SentinelMaster is set.
	SentinelAddresses []string
	// SentinelUsername is the ACL user to authenticate to the sentinels
	// as. Default "": the sentinels' default user.
	SentinelUsername string
	// SentinelPassword authenticates to the sentinels (with
	// SentinelUsername, or alone as their requirepass). It is for the
	// sentinels only: the master takes Password. Default "": no AUTH.
	SentinelPassword string
	// Username is the ACL user to authenticate to the Redis servers as.
	// Default "": the default user.
	Username string
	// Password authenticates to the Redis servers (the master, under
	// Sentinel): with Username an ACL user's password, alone the
	// requirepass. Default "": no AUTH.
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
	// node was able to run (wall time with DisableStallClock): a node
	// whose CPUs are saturated reads Redis' replies late, and waits for
	// them rather than taking the failure policy, up to MaxWait. Default
	// 25ms.
	Timeout time.Duration
	// MaxWait bounds a decision's wait in wall time, however starved the
	// node: the hard cap, once the node has run for Timeout since the
	// decision began (a frozen process first reads what waits in its
	// sockets); never more than twice MaxWait. Default 1s (at least
	// Timeout). A decision that began before the start-up connection
	// attempt ended (see WaitWarm) waits up to MaxWait in wall time
	// whatever its round trip. See RedisStore.extension.
	MaxWait time.Duration
	// DisableStallClock switches off the stall clock (stallClock): Timeout
	// then counts wall time, so a decision on a node whose CPUs are
	// saturated gives up at Timeout like one that Redis left waiting, and
	// the node saves the clock's wake-up every 5ms. Default false: the
	// clock runs, and a starved node waits for Redis' replies (up to
	// MaxWait).
	DisableStallClock bool
	// DialTimeout bounds opening a connection. Default 1s. The start-up
	// connection attempt (see WaitWarm) gives up after DialTimeout +
	// Timeout.
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
	// Clock, when set, is the scripts' time (Now().UnixMicro(), sent with
	// each script call) instead of Redis TIME: tests only, to replay a
	// trace on a controlled clock. Default nil: the scripts read Redis
	// TIME, the same for every node whatever their own clocks say. (Unlike
	// the other stores' Clock, nil does not mean this node's clock.) The
	// outage barrier (ChargesIn) reads Redis TIME whatever it is.
	Clock Clock
}

// addrs returns every address of the options.
// maxKeyPrefix is the longest key prefix: it starts every key.
const maxKeyPrefix = 64

// CheckKeyPrefix reports a key prefix that would break keys: longer than
// 64 bytes, or with a brace (a Cluster hash tag in the prefix would put
// every bucket in one slot), a space or a control byte.
func CheckKeyPrefix(p string) error {
	if len(p) > maxKeyPrefix {
		return fmt.Errorf("key_prefix must be at most %d bytes, got %d", maxKeyPrefix, len(p))
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c == '{' || c == '}' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("key_prefix must not hold braces, spaces or control characters, got %q", p)
		}
	}
	return nil
}

func (o *RedisOptions) addrs() []string {
	var all []string
	if o.Address != "" {
		all = append(all, o.Address)
	}
	return append(all, o.Addresses...)
}

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
	clock   Clock // nil: Redis TIME
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
	// slow remembers the slowest round trips lately (see slowTrips).
	slow slowTrips
	// extended counts decisions that waited past the timeout because this
	// node was starved, or Redis was answering slowly but answering.
	extended atomic.Uint64
	// abandonedRefunded counts abandoned decisions whose charges were refunded
	// (RedisStore.refundCall).
	abandonedRefunded atomic.Uint64
	// slotRefundsSent counts the slot refunds of decisions whose replies
	// were lost, and slot refunds those waiting to be tried again
	// (RedisStore.refundCall).
	slotRefundsSent atomic.Uint64
	slotRefunds     pendingSlotRefunds
	// bans is the ban registry and the ban channel's subscriber
	// (redisBans, banListener).
	bans *redisBans
	// lims are the limiters told of keys reset (ResetKey).
	lims limiterSet
	// probe is the idle prober's latest PING (probeIdle).
	probe idleProbe
	// id tells this node's entries in Redis from the others' (ChargesIn).
	id string
	// owing counts the limiters on this store that have local admissions
	// to charge (owe).
	owing atomic.Int64
	// barrier is this node's last record in the outage barrier
	// (ChargesIn).
	barrier nodeBarrier

	// warmed is closed when the start-up connection attempt (warm) ends,
	// with warmErr its outcome and warmedAt when, on the stall clock
	// (math.MaxInt64 until then).
	warmed   chan struct{}
	warmErr  error
	warmedAt atomic.Int64

	queue chan *call
	stop  chan struct{}
	wg    sync.WaitGroup
}

// NewRedisStore starts connecting to Redis in the background (see
// WaitWarm) and starts the pipeline workers; Close stops them. It fails
// only on invalid options: an unreachable Redis is a decision-time error,
// handled by the failure policy.
func NewRedisStore(opt RedisOptions) (*RedisStore, error) {
	cluster, err := opt.check()
	if err != nil {
		return nil, err
	}
	opt.setDefaults()
	client := goRedisClient(&opt, cluster)
	s := &RedisStore{
		client:     client,
		prefix:     opt.KeyPrefix,
		timeout:    opt.Timeout,
		maxWait:    opt.MaxWait,
		clock:      opt.Clock,
		stall:      stallClockOf(opt.DisableStallClock),
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
		id:         newNodeID(),
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
	s.bans = startRedisBans(s)
	s.wg.Go(s.probeIdle)
	s.warmedAt.Store(math.MaxInt64)
	s.wg.Go(func() { s.warm(opt.DialTimeout + opt.Timeout) })
	return s, nil
}

// check rejects invalid options, and reports whether they name a Redis
// Cluster.
func (o *RedisOptions) check() (cluster bool, err error) {
	addrs := o.addrs()
	switch {
	case o.SentinelMaster != "" && len(o.SentinelAddresses) == 0:
		return false, errors.New("redis sentinel needs at least one sentinel address")
	case o.SentinelMaster != "" && len(addrs) > 0:
		return false, errors.New("redis: give either sentinels or server addresses, not both")
	case o.SentinelMaster == "" && len(addrs) == 0:
		return false, errors.New("redis address is required")
	case o.Protocol != 0 && o.Protocol != 2 && o.Protocol != 3:
		return false, fmt.Errorf("redis protocol must be 2 or 3, not %d", o.Protocol)
	}
	if err := CheckKeyPrefix(o.KeyPrefix); err != nil {
		return false, err
	}
	cluster = o.SentinelMaster == "" && (o.Cluster || len(addrs) > 1)
	if cluster && o.DB != 0 {
		return false, errors.New("redis cluster has only database 0")
	}
	return cluster, nil
}

// setDefaults fills in the defaults the fields' comments state.
func (o *RedisOptions) setDefaults() {
	if o.KeyPrefix == "" {
		o.KeyPrefix = "rl:"
	}
	if o.Timeout <= 0 {
		o.Timeout = 25 * time.Millisecond
	}
	if o.MaxWait <= 0 {
		o.MaxWait = time.Second
	}
	o.MaxWait = max(o.MaxWait, o.Timeout)
	if o.DialTimeout <= 0 {
		o.DialTimeout = time.Second
	}
	if o.Pipelines <= 0 {
		o.Pipelines = 1
	}
	if o.PoolSize <= 0 {
		o.PoolSize = o.Pipelines + 2
	}
}

// goRedisClient makes the go-redis client of checked options with their
// defaults set.
func goRedisClient(opt *RedisOptions, cluster bool) redis.UniversalClient {
	addrs := opt.addrs()
	if opt.SentinelMaster != "" {
		addrs = opt.SentinelAddresses // go-redis takes the sentinels as Addrs
	}
	return redis.NewUniversalClient(&redis.UniversalOptions{
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
}

// Client returns the underlying go-redis client.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

// KeyPrefix returns the prefix of every key the store writes
// (RedisOptions.KeyPrefix).
func (s *RedisStore) KeyPrefix() string { return s.prefix }

// Clock returns this node's clock as the store reads it: RedisOptions.Clock,
// or the node's default clock (see Clock). Buckets never read it.
func (s *RedisStore) Clock() Clock { return clockOr(s.clock) }

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
	boundCosts(reqs)
	allowed, probe := s.breaker.allow()
	if !allowed {
		return false, ErrBreakerOpen
	}
	ok, token, err := s.decide(ctx, reqs, results)
	var refused *requestError
	switch {
	case err == nil:
		if s.breaker.succeed() {
			s.bans.breakerClosed()
		}
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

// Error returns the command's error, prefixed with "redis: ".
func (e *requestError) Error() string { return "redis: " + e.err.Error() }

// Unwrap returns the command's error.
func (e *requestError) Unwrap() error { return e.err }

// decide returns the decision, and with an error its failure token (see
// failureToken; 0: not the store's failure).
func (s *RedisStore) decide(ctx context.Context, reqs []Request, results []Result) (bool, uint64, error) {
	if !s.cluster || len(reqs) == 1 {
		return s.decideOne(ctx, reqs, results)
	}
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	// Once sent, the calls are waited for even if the client leaves (as
	// decideOne does): Redis will run them, and a request that gave up
	// would leave their charges (a concurrency slot, say) unrefunded. The
	// caller's deadline still ends the wait, as the timeout does.
	base := context.WithoutCancel(ctx)
	_, capped, failure := s.waitFor(ctx)
	if capped {
		d, _ := ctx.Deadline()
		var cancelDeadline context.CancelFunc
		base, cancelDeadline = context.WithDeadlineCause(base, d, s.errTimeout)
		defer cancelDeadline()
	}
	ctx, cancel := s.timeoutContext(base)
	defer cancel()
	ok, err := s.decideBySlot(ctx, reqs, results)
	switch {
	case err != nil && base.Err() != nil && !failure:
		return ok, 0, err // the caller's short deadline is no failure of Redis
	case err != nil:
		return ok, s.trips.Add(1)<<16 | tripFailed, err // several round trips: count it as one more
	}
	return ok, 0, nil
}

// waitFor returns how long a decision waits for Redis: the timeout, or,
// capped, the time left until ctx's deadline when that comes first; and
// whether running out of it is Redis' failure, for a decision of several
// round trips (one by failureToken counts a round trip overdue, however
// short its callers' deadlines). The stall clock does not extend a capped
// wait (the caller has gone by then). Running out of a capped wait is
// Redis' failure when the wait was at least half the timeout (a Redis that
// slow fails whoever asks), not when it was shorter: a caller's short
// deadline says nothing of Redis.
func (s *RedisStore) waitFor(ctx context.Context) (wait time.Duration, capped, failure bool) {
	d, ok := ctx.Deadline()
	if !ok {
		return s.timeout, false, true
	}
	if left := time.Until(d); left < s.timeout {
		return max(left, 0), true, left >= s.timeout/2
	}
	return s.timeout, false, true
}

// timeoutContext returns a context that ends when the decision has waited
// Timeout in the time this node was able to run, or MaxWait in all (see
// extension); its cause is then the store's timeout error.
func (s *RedisStore) timeoutContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	start := s.stall.mark()
	// An extension arms a timer of its own: the first one's callback
	// cannot reach the variable its creation is still assigning.
	var fire func()
	fire = func() {
		if ctx.Err() != nil {
			return
		}
		if wait := s.extension(start, 0); wait > 0 {
			time.AfterFunc(wait, fire)
			return
		}
		cancel(s.errTimeout)
	}
	t := time.AfterFunc(s.timeout, fire)
	return ctx, func() { t.Stop(); cancel(context.Canceled) }
}

// decideOne decides a request in one script call: the common path, so it
// recycles its call (channel, timer, slices) and bounds the wait with the
// call's own timer rather than a new context per decision. It looks at ctx
// only before it starts, and for its deadline (see waitFor): a request
// whose client leaves meanwhile waits at most the timeout, and watching
// ctx would cost every decision a channel.
func (s *RedisStore) decideOne(ctx context.Context, reqs []Request, results []Result) (bool, uint64, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	c := callPool.Get().(*call)
	s.fill(c, s.script, reqs, nil, nil)
	start := s.stall.mark()
	limit, capped, _ := s.waitFor(ctx)
	if c.timer == nil {
		c.timer = time.NewTimer(limit)
	} else {
		c.timer.Reset(limit)
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
				if wait := s.extension(start, 0); wait > 0 && !capped {
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
			if wait := s.extension(start, c.trip.Load()); wait > 0 && !capped {
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
		if c.abandon() {
			return false, token, gaveUp // the worker refunds its charges and returns it to the pool
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

// Refund implements Store: it refunds what Decide charged the zones of
// reqs (results are Decide's), in one script call per Cluster slot, queued
// like the decisions and bounded by the store's timeout.
func (s *RedisStore) Refund(ctx context.Context, reqs []Request, results []Result) error {
	boundCosts(reqs)
	ctx, cancel := s.timeoutContext(ctx)
	defer cancel()
	groups := [][]int{nil}
	if s.cluster && len(reqs) > 1 {
		groups = s.groupBySlot(reqs)
	}
	calls := make([]*call, len(groups))
	for g, idx := range groups {
		calls[g] = s.newCall(s.refund, reqs, idx, results)
	}
	var firstErr error
	for _, err := range s.sendAll(ctx, calls) {
		firstErr = orErr(firstErr, err)
	}
	return firstErr
}

// Close stops the workers and closes the connections.
func (s *RedisStore) Close() error {
	close(s.stop)
	s.wg.Wait()
	s.stall.close()
	return s.client.Close()
}

// ctxErr is the error of a decision whose context ended: the store's
// timeout error when it ran out of time, else the context's own.
func (s *RedisStore) ctxErr(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrStoreTimeout) {
		return cause
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return s.errTimeout
	}
	return ctx.Err()
}

// Interface guard.
var _ Store = (*RedisStore)(nil)

// cancelOnClose calls cancel, ctx's, when the store closes first: the
// store's own background round trips end with it.
func (s *RedisStore) cancelOnClose(ctx context.Context, cancel context.CancelFunc) {
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
}
