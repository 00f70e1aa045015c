package fleetlimit

import (
	"errors"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

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

// UnmarshalCaddyfile reads a redis block, the dispenser on its `redis`
// token, as the rate_limit directive reads it: the same subdirectives,
// checked the same way, errors with the file and line.
func (c *RedisConfig) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return c.unmarshalCaddyfile(d)
}

// Validate checks the connection settings as rate_limit does before it
// connects (without expanding placeholders or reading TLS files).
func (c *RedisConfig) Validate() error { return c.validate() }
