package fleetlimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// The stores outlive config reloads: a new configuration provisions before
// the old one is cleaned up, so a Redis client (and its connections) or the
// process's memory store is handed from one to the next, and closed when
// the last handler using it is cleaned up.

// stores holds the stores shared by handlers across config reloads, by
// pool key: memoryPoolKey, or a Redis connection's redisOptions.poolKey.
var stores = caddy.NewUsagePool()

// memoryPoolKey is the pool key of the process's one memory store.
const memoryPoolKey = "memory"

// memoryStore and redisStore are the pooled stores. The memory store
// carries the settings its handlers asked for.
type memoryStore struct {
	*limiter.MemoryStore
	settings *memorySettings
}

// memorySettings are the key bounds and sweep intervals that the handlers
// using the memory store wrote. The store is one per process, and Caddy
// provisions a configuration's servers in no fixed order, so no handler's
// setting may depend on which came last: the smallest max_keys any
// handler still provisioned wrote bounds the store, and the shortest
// sweep_interval sets its sweeps. A handler that wrote neither (a site
// that only falls back to the store: a Redis zone with on_error local)
// changes nothing; only when no handler wrote one do the defaults hold.
// A configuration whose load failed after its handlers were provisioned
// has them cleaned up, and the settings of the one still running come
// back.
type memorySettings struct {
	mu     sync.Mutex
	claims []memoryClaim
}

// memoryClaim is one handler's settings of the memory store: its max_keys
// and sweep_interval, 0 where it wrote none.
type memoryClaim struct {
	owner   *Handler
	maxKeys int
	sweep   time.Duration
}

// claim records owner's settings (once per owner) and applies them all.
func (m *memorySettings) claim(s *limiter.MemoryStore, c memoryClaim) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.claims = slices.DeleteFunc(m.claims, func(o memoryClaim) bool { return o.owner == c.owner })
	m.claims = append(m.claims, c)
	m.apply(s)
}

// release forgets owner's settings and applies those left.
func (m *memorySettings) release(s *limiter.MemoryStore, owner *Handler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.claims = slices.DeleteFunc(m.claims, func(o memoryClaim) bool { return o.owner == owner })
	m.apply(s)
}

// apply sets the store's settings from the claims, with m locked: the
// smallest of each that a handler wrote, or the default.
func (m *memorySettings) apply(s *limiter.MemoryStore) {
	if len(m.claims) == 0 {
		return
	}
	maxKeys, sweep := 0, time.Duration(0)
	for _, c := range m.claims {
		if c.maxKeys > 0 && (maxKeys == 0 || c.maxKeys < maxKeys) {
			maxKeys = c.maxKeys
		}
		if c.sweep > 0 && (sweep == 0 || c.sweep < sweep) {
			sweep = c.sweep
		}
	}
	s.SetMaxKeys(cmp.Or(maxKeys, DefaultMaxKeys))
	s.SetSweepInterval(cmp.Or(sweep, DefaultSweepInterval))
}

// Destruct closes the store when its last user is gone.
func (s memoryStore) Destruct() error { return s.Close() }

type redisStore struct{ *limiter.RedisStore }

// Destruct closes the store when its last user is gone.
func (s redisStore) Destruct() error { return s.Close() }

// provisionStore returns the shared store for this configuration, creating
// it on first use, and the pool key to release it with.
func (h *Handler) provisionStore() (limiter.Store, string, error) {
	if h.Redis == nil {
		s, err := h.loadMemoryStore()
		return s, memoryPoolKey, err
	}
	opt, err := h.Redis.options()
	if err != nil {
		return nil, "", err
	}
	opt.Log = h.logger
	key := opt.poolKey()
	v, loaded, err := stores.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := limiter.NewRedisStore(opt.RedisOptions)
		if err != nil {
			return nil, err
		}
		return redisStore{s}, nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("redis: %w", err)
	}
	s := v.(redisStore).RedisStore
	h.awaitWarm(s, !loaded)
	return s, key, nil
}

// awaitWarm waits until the store's start-up connection attempt has ended
// (limiter.RedisStore.WaitWarm: at most dial_timeout + timeout), so that
// Caddy serves, and the first requests are decided, on a store that has
// connected and loaded its scripts whenever Redis answers at start-up. A
// store taken over from the previous configuration (a reload) has ended
// its attempt long ago: the reload does not wait. The handler that made
// the store (made) warns when Redis did not answer.
func (h *Handler) awaitWarm(s *limiter.RedisStore, made bool) {
	err := s.WaitWarm(context.Background())
	if err != nil && made && !errors.Is(err, limiter.ErrRedisCredentials) {
		h.logger.Warn("redis did not answer as the rate limit store started; decisions take their zone's on_error policy until it does",
			zap.String("store", h.storeName()), zap.Error(err))
	}
}

// DefaultMaxKeys is how many buckets a node keeps in memory when no
// handler sets max_keys: about 100 B of heap each, so at most about 50 MB
// live, and 100 MB with the garbage collector's headroom.
const DefaultMaxKeys = 500_000

// DefaultSweepInterval is how often the memory store drops full buckets
// when no handler sets sweep_interval.
const DefaultSweepInterval = time.Minute

// loadMemoryStore returns this process's memory store, shared by every
// handler and configuration (release it with stores.Delete(memoryPoolKey)
// and releaseMemorySettings), and adds this handler's max_keys and
// sweep_interval to its settings (memorySettings).
func (h *Handler) loadMemoryStore() (*limiter.MemoryStore, error) {
	v, _, err := stores.LoadOrNew(memoryPoolKey, func() (caddy.Destructor, error) {
		return memoryStore{limiter.NewMemoryStore(limiter.MemoryOptions{Sweep: DefaultSweepInterval}), &memorySettings{}}, nil
	})
	if err != nil {
		return nil, err
	}
	ms := v.(memoryStore)
	ms.settings.claim(ms.MemoryStore, memoryClaim{owner: h, maxKeys: h.MaxKeys, sweep: time.Duration(h.SweepInterval)})
	h.memory = &ms
	return ms.MemoryStore, nil
}

// releaseMemorySettings withdraws this handler's settings of the memory
// store, if it used it.
func (h *Handler) releaseMemorySettings() {
	if h.memory != nil {
		h.memory.settings.release(h.memory.MemoryStore, h)
	}
}

// storeName names the handler's store in metric labels and the admin API:
// the servers it talks to (from the configuration, placeholders
// unexpanded; never a credential), or "memory".
func (h *Handler) storeName() string {
	c := h.Redis
	if c == nil {
		return "memory"
	}
	var name string
	switch {
	case c.SentinelMaster != "":
		name = "sentinel:" + c.SentinelMaster
	case c.Cluster || len(c.Addresses) > 0:
		addrs := c.Addresses
		if c.Address != "" {
			addrs = append([]string{c.Address}, addrs...)
		}
		name = "cluster:" + strings.Join(addrs, ",")
	default:
		name = "redis:" + c.Address
	}
	if c.DB != 0 {
		name += "/" + strconv.Itoa(c.DB)
	}
	return name
}

// SharedStore is a store taken from the pool that rate_limit handlers take
// theirs from, for another Caddy module (the Envoy rate limit service): the
// same Redis client as the handlers with the same redis configuration, or
// this process's memory store, so that both decide on the same buckets
// through one client. It outlives config reloads as the handlers' stores
// do; Release gives it back.
type SharedStore struct {
	// Store decides: Redis, or the memory store when the configuration
	// has no redis block.
	Store limiter.Store
	// Local is this process's memory store, for the fallback buckets of
	// rules whose failure policy is local; nil unless asked for.
	Local limiter.Store

	owner    *Handler // holds the pool's claims, as a handler would
	keys     []string // the pool keys to release
	released bool
}

// StoreOptions are what ProvisionStore needs besides the Redis settings.
type StoreOptions struct {
	// Local also provides this process's memory store for local fallback
	// buckets (SharedStore.Local).
	Local bool
	// MaxKeys and SweepInterval are the memory store's key bound and
	// sweep interval, with the meaning and defaults of the handler's
	// max_keys and sweep_interval: the memory store is shared by the
	// whole process, and the smallest of each that any of its users
	// sets holds (0: none set).
	MaxKeys       int
	SweepInterval time.Duration
	// Log receives the store's reports (Redis refusing credentials, its
	// memory policy).
	Log *zap.Logger
}

// ProvisionStore validates redis (nil: the memory store) and returns the
// shared store for it, creating it on first use. Call Release when the
// caller is cleaned up.
func ProvisionStore(redis *RedisConfig, opt StoreOptions) (*SharedStore, error) {
	if redis != nil {
		if err := redis.validate(); err != nil {
			return nil, err
		}
	}
	log := opt.Log
	if log == nil {
		log = zap.NewNop()
	}
	h := &Handler{Redis: redis, logger: log, MaxKeys: opt.MaxKeys, SweepInterval: caddy.Duration(opt.SweepInterval)}
	s := &SharedStore{owner: h}
	store, key, err := h.provisionStore()
	if err != nil {
		return nil, err
	}
	s.Store, s.keys = store, append(s.keys, key)
	if opt.Local {
		local, err := h.loadMemoryStore()
		if err != nil {
			return nil, errors.Join(err, s.Release())
		}
		s.Local, s.keys = local, append(s.keys, memoryPoolKey)
	}
	return s, nil
}

// ObserveConfig returns the observe.Config of a user of the store other
// than a handler (the Envoy rate limit service), with its zones left to
// fill: the store, its statistics' key and name as the handlers on it
// have them (so that they count together), the memory store, and the key
// digests of handlers without key_digest_secret (from Caddy's storage).
func (s *SharedStore) ObserveConfig(ctx caddy.Context) (observe.Config, error) {
	h := s.owner
	if err := h.provisionDigester(ctx); err != nil {
		return observe.Config{}, err
	}
	return observe.Config{
		Store:     s.Store,
		StoreKey:  s.keys[0],
		StoreName: h.storeName(),
		Memory:    memoryOf(s.Store, s.Local),
		Digest:    h.digest,
	}, nil
}

// Release gives the store back to the pool (the last user closes it) and
// withdraws this user's memory store settings. Calling it twice is
// harmless.
func (s *SharedStore) Release() error {
	if s == nil || s.released {
		return nil
	}
	s.released = true
	s.owner.releaseMemorySettings()
	var err error
	for _, key := range s.keys {
		if _, e := stores.Delete(key); e != nil {
			err = e
		}
	}
	return err
}
