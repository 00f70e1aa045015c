package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/lua"
)

// RedisOptions configures a RedisStore.
type RedisOptions struct {
	// Address is the Redis server's host:port.
	Address string
	// Username and Password authenticate (ACL user, or password alone).
	Username string
	Password string
	// DB is the database number.
	DB int
	// KeyPrefix starts every bucket key. Default "rl:".
	KeyPrefix string
	// Timeout bounds one decision, queueing included. Default 25ms.
	Timeout time.Duration
	// DialTimeout bounds opening a connection. Default 1s.
	DialTimeout time.Duration
	// Pipelines is how many round trips may be in flight at once; every
	// decision that arrives while they are busy joins the next one.
	// Default 8.
	Pipelines int
	// BreakerFailures is how many consecutive failed decisions open the
	// circuit breaker. Default 5.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker keeps decisions away
	// from Redis before one probe may close it. Default 1s.
	BreakerCooldown time.Duration
	// Clock, when set, fixes the script's time (microseconds) for tests.
	// Production leaves it nil: the clock is then Redis TIME, the same for
	// every node whatever their own clocks say.
	Clock func() int64
}

// quietRedisLog replaces go-redis' own logger, which prints every failed
// dial to standard error: the Limiter reports store failures itself, at
// most once a second, without connection details that could carry secrets.
type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

var silenceRedisLog sync.Once

// maxBatch bounds how many decisions share one round trip.
const maxBatch = 256

// RedisStore keeps buckets in Redis, so that every node pointed at the same
// Redis shares them. Each decision is one EVALSHA of the token bucket script
// covering all zones of the request; decisions made concurrently share round
// trips (automatic pipelining): a few workers each take everything queued,
// write it in one go and read the replies in order.
type RedisStore struct {
	client  *redis.Client
	prefix  string
	timeout time.Duration
	clock   func() int64
	script  *redis.Script
	breaker *Breaker

	queue chan *call
	stop  chan struct{}
	wg    sync.WaitGroup
}

// call is one decision travelling to a pipeline worker and back.
type call struct {
	keys  []string
	args  []any
	reply []any
	err   error
	done  chan struct{}
}

// NewRedisStore connects lazily to Redis and starts the pipeline workers;
// Close stops them. It fails only on invalid options: an unreachable Redis
// is a decision-time error, handled by the failure policy.
func NewRedisStore(opt RedisOptions) (*RedisStore, error) {
	if opt.Address == "" {
		return nil, errors.New("redis address is required")
	}
	if opt.KeyPrefix == "" {
		opt.KeyPrefix = "rl:"
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 25 * time.Millisecond
	}
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = time.Second
	}
	if opt.Pipelines <= 0 {
		opt.Pipelines = 8
	}
	silenceRedisLog.Do(func() { redis.SetLogger(quietRedisLog{}) })
	client := redis.NewClient(&redis.Options{
		Addr:        opt.Address,
		Username:    opt.Username,
		Password:    opt.Password,
		DB:          opt.DB,
		DialTimeout: opt.DialTimeout,
		// Fail at once when Redis refuses connections: the failure policy,
		// not a dial loop, decides what happens meanwhile.
		DialerRetries:         1,
		ReadTimeout:           opt.Timeout,
		WriteTimeout:          opt.Timeout,
		ContextTimeoutEnabled: true,
		// A retried EVALSHA could charge a bucket twice.
		MaxRetries: -1,
		PoolSize:   opt.Pipelines + 2,
	})
	s := &RedisStore{
		client:  client,
		prefix:  opt.KeyPrefix,
		timeout: opt.Timeout,
		clock:   opt.Clock,
		script:  redis.NewScript(lua.TokenBucket),
		breaker: NewBreaker(opt.BreakerFailures, opt.BreakerCooldown),
		queue:   make(chan *call, 4096),
		stop:    make(chan struct{}),
	}
	for range opt.Pipelines {
		s.wg.Add(1)
		go s.worker()
	}
	return s, nil
}

// Client returns the underlying go-redis client.
func (s *RedisStore) Client() *redis.Client { return s.client }

// Key returns the Redis key of a zone's bucket for a client key: the prefix,
// the zone, and the client key inside a Cluster hash tag, so that all of a
// client's buckets in one zone share a slot. ClientKey guarantees the client
// key holds no brace.
func (s *RedisStore) Key(zone, clientKey string) string {
	return s.prefix + zone + ":{" + clientKey + "}"
}

// Breaker returns the store's circuit breaker.
func (s *RedisStore) Breaker() *Breaker { return s.breaker }

// Decide implements Store. While the circuit breaker is open it fails at
// once with ErrBreakerOpen.
func (s *RedisStore) Decide(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	if !s.breaker.Allow() {
		return false, ErrBreakerOpen
	}
	ok, err := s.decide(ctx, reqs, results)
	switch {
	case err == nil:
		s.breaker.Success()
	case !errors.Is(err, context.Canceled): // a client that left is not Redis' fault
		s.breaker.Failure()
	}
	return ok, err
}

func (s *RedisStore) decide(ctx context.Context, reqs []Request, results []Result) (bool, error) {
	c := &call{
		keys: make([]string, len(reqs)),
		args: make([]any, 1, 1+4*len(reqs)),
		done: make(chan struct{}, 1),
	}
	c.args[0] = "0"
	if s.clock != nil {
		c.args[0] = strconv.FormatInt(s.clock(), 10)
	}
	for i := range reqs {
		r := reqs[i].Rule
		c.keys[i] = s.Key(r.Name, reqs[i].Key)
		c.args = append(c.args, r.Denom, r.Interval, r.Burst, reqs[i].Cost)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	select {
	case s.queue <- c:
	case <-ctx.Done():
		return false, s.ctxErr(ctx)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return false, s.ctxErr(ctx)
	}
	if c.err != nil {
		return false, c.err
	}
	return decodeReply(c.reply, reqs, results)
}

// Ping checks that Redis answers.
func (s *RedisStore) Ping(ctx context.Context) error {
	return s.client.Ping(ctx).Err()
}

// Close stops the workers and closes the connections.
func (s *RedisStore) Close() error {
	close(s.stop)
	s.wg.Wait()
	return s.client.Close()
}

func (s *RedisStore) ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w (%s)", ErrStoreTimeout, s.timeout)
	}
	return ctx.Err()
}

func (s *RedisStore) worker() {
	defer s.wg.Done()
	batch := make([]*call, 0, maxBatch)
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
		s.run(batch)
		clear(batch)
	}
}

// run sends a batch in one pipeline. A pipelined EVALSHA cannot fall back to
// EVAL by itself, so calls answered NOSCRIPT (Redis restarted, or SCRIPT
// FLUSH) are sent again once the script is loaded: NOSCRIPT means the
// script did not run, so nothing is charged twice.
func (s *RedisStore) run(batch []*call) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	cmds := s.exec(ctx, batch)
	var again []*call
	var pos []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			again, pos = append(again, batch[i]), append(pos, i)
		}
	}
	if len(again) > 0 {
		if err := s.script.Load(ctx, s.client).Err(); err == nil {
			for j, cmd := range s.exec(ctx, again) {
				cmds[pos[j]] = cmd
			}
		}
	}
	for i, c := range batch {
		c.reply, c.err = cmds[i].Slice()
		if c.err != nil {
			c.err = s.cmdErr(c.err)
		}
		c.done <- struct{}{}
	}
}

// cmdErr wraps a command's error. A socket deadline or the batch's context
// running out is a timeout like the caller's own, so it is ErrStoreTimeout
// too: whichever fires first, callers can tell a hung Redis apart.
func (s *RedisStore) cmdErr(err error) error {
	var ne net.Error // context.DeadlineExceeded is one as well
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w (%s): redis: %w", ErrStoreTimeout, s.timeout, err)
	}
	return fmt.Errorf("redis: %w", err)
}

func (s *RedisStore) exec(ctx context.Context, batch []*call) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(batch))
	pipe := s.client.Pipeline()
	for i, c := range batch {
		cmds[i] = s.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// decodeReply turns the script's reply into results, through the same
// Rule.result as the memory store.
func decodeReply(reply []any, reqs []Request, results []Result) (bool, error) {
	if len(reply) != 1+3*len(reqs) {
		return false, fmt.Errorf("redis: unexpected script reply of %d values for %d zones", len(reply), len(reqs))
	}
	var vals [4]int64
	admit := false
	for i := range reqs {
		for j := range 3 {
			n, ok := reply[1+3*i+j].(int64)
			if !ok {
				return false, fmt.Errorf("redis: unexpected script reply value %T", reply[1+3*i+j])
			}
			vals[j] = n
		}
		if n, ok := reply[0].(int64); ok {
			admit = n == 1
		}
		v := verdict{debt: vals[0], after: vals[1], ok: vals[2] == 1, never: vals[2] == 2}
		results[i] = reqs[i].Rule.result(v, admit)
	}
	return admit, nil
}

// Interface guard.
var _ Store = (*RedisStore)(nil)
