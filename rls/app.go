// Package rls is a Caddy app, rate_limit_rls, that serves Envoy's Rate
// Limit Service (RLS v3, envoy.service.ratelimit.v3.RateLimitService) from
// the buckets of fleetlimit's rate_limit handler: the same limiter, the same
// Redis client or memory store, so that Envoy, Istio or Envoy Gateway and a
// Caddy edge share one limit. It reads envoyproxy/ratelimit's YAML
// configuration unchanged (package rls/config) and decides every descriptor
// of a request in one atomic call: a request that one descriptor denies is
// charged to none. It is a package of its own so that a Caddy built for
// HTTP limits alone links none of Envoy's types.
package rls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

func init() {
	caddy.RegisterModule(App{})
}

// App serves ShouldRateLimit over gRPC, on plaintext HTTP/2 (h2c) and/or
// TLS, with the standard gRPC health service beside it. Its rules come
// either from envoyproxy/ratelimit's YAML files in ConfigDir, followed as
// they change, or over xDS from a management server (XDS), as the
// reference's CONFIG_TYPE chooses FILE or GRPC_XDS_SOTW. A reload
// (`caddy reload`) starts the new configuration's servers beside the old
// ones (the ports are shared) and stops the old ones gracefully: calls in
// flight are answered.
type App struct {
	// Listen are the addresses that serve plaintext gRPC (HTTP/2 with
	// prior knowledge, as Envoy's cluster with http2_protocol_options
	// connects), in Caddy's network address form (`127.0.0.1:8081`,
	// `:8081`, `unix//run/rls.sock`). Default: `:8081`, the port of
	// envoyproxy/ratelimit, when TLS gives no address either.
	Listen []string `json:"listen,omitempty"`

	// TLS serves gRPC over TLS on addresses of its own, with mutual TLS
	// when it names a client CA (as Envoy Gateway connects).
	TLS *TLS `json:"tls,omitempty"`

	// ConfigDir is the directory of envoyproxy/ratelimit's configuration:
	// one YAML file per domain, subdirectories included, files and
	// directories whose names start with a dot skipped (a Kubernetes
	// ConfigMap mounted as the directory reads as it should). Required,
	// unless the rules come over XDS; not both.
	ConfigDir string `json:"config_dir,omitempty"`

	// XDS subscribes to the rules over xDS (state of the world), as
	// Envoy Gateway configures its rate limit service, instead of
	// reading ConfigDir. Until the first update arrives no domain is
	// known and every call is answered OK, as the reference's with
	// FORCE_START_WITHOUT_INITIAL_CONFIG (which Envoy Gateway sets);
	// after a reload, the previous configuration's last rules decide
	// until the new stream has an answer.
	XDS *XDS `json:"xds,omitempty"`

	// Redis shares the buckets through Redis: the same settings as the
	// rate_limit handler's redis block (single, Sentinel, Cluster, TLS,
	// ACLs, timeout, breaker). Handlers and this app with the same
	// settings share one client, and a descriptor and a zone with the
	// same bucket count together. Without it the buckets live in this
	// process's memory store, shared with the rate_limit handlers that
	// have no redis block either.
	Redis *fleetlimit.RedisConfig `json:"redis,omitempty"`

	// OnError is what a rule does when Redis cannot decide in time (down,
	// hung, the breaker open, or the caller's deadline reached first):
	// `local` (the default) decides on this node's own buckets with the
	// rule's limit divided by FleetSize; `deny` answers OVER_LIMIT, so
	// that Envoy rejects the request (a gRPC error would let it through
	// unless the filter sets failure_mode_deny); `allow` answers OK.
	OnError string `json:"on_error,omitempty"`

	// FleetSize is how many service nodes share the limits, for the
	// `local` policy: each node's fallback bucket gets 1/FleetSize of a
	// rule's limit. Default: 1.
	FleetSize int64 `json:"fleet_size,omitempty"`

	// MaxKeys bounds the buckets of the memory store (and of local
	// fallback buckets), as the rate_limit handler's max_keys: the store
	// is shared by the whole process, and the smallest bound any of its
	// users sets holds. Default (when none sets one): 500000.
	MaxKeys int `json:"max_keys,omitempty"`

	// MaxDescriptors is the most descriptors one call may carry; a call
	// with more is refused with INVALID_ARGUMENT and charges nothing.
	// Default: 64.
	MaxDescriptors int `json:"max_descriptors,omitempty"`

	// MaxEntries is the most entries one descriptor may carry. Default:
	// 16.
	MaxEntries int `json:"max_entries,omitempty"`

	// MaxEntryBytes is the longest key or value of an entry, in bytes.
	// Values are hashed into bucket keys whatever their length; this
	// bounds the work a call can ask for. Default: 4096.
	MaxEntryBytes int `json:"max_entry_bytes,omitempty"`

	// ConfigRefreshInterval is how often the app looks for changes of
	// ConfigDir's files; changed files are loaded again and their rules
	// take over between two calls (rules that do not load are logged,
	// with the file and line, and the previous ones stay), as
	// envoyproxy/ratelimit follows its files. Default: 10s.
	ConfigRefreshInterval caddy.Duration `json:"config_refresh_interval,omitempty"`

	// GracePeriod is how long a stopping server (at a reload or at exit)
	// lets the calls in flight finish before it closes their connections.
	// Default: 5s.
	GracePeriod caddy.Duration `json:"grace_period,omitempty"`

	logger    *zap.Logger
	tlsConfig *tls.Config // TLS, its files read
	store     *fleetlimit.SharedStore
	limiter   *limiter.Limiter
	service   *service
	servers   []*server
	watcher   *watcher      // nil when the rules come over xDS
	xds       *subscription // nil when the rules come from ConfigDir
	lastXDS   *lastXDS      // from lastXDSPool, with xds
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rate_limit_rls",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision checks the configuration, reads the rules from ConfigDir,
// takes the store from the pool the rate_limit handlers share and sets up
// the service. The servers start in Start.
func (a *App) Provision(ctx caddy.Context) error {
	if a.logger == nil { // tests may set their own
		a.logger = ctx.Logger()
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if a.TLS != nil {
		var err error
		if a.tlsConfig, err = a.TLS.config(); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
	}
	cfg, err := a.initialRules()
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		a.logger.Warn("rate limit service configuration", zap.String("warning", w))
	}
	policy, _ := limiter.ParsePolicy(a.OnError) // validated
	if err := zonesFirst(ctx, cfg); err != nil {
		return err
	}
	a.store, err = fleetlimit.ProvisionStore(a.Redis, fleetlimit.StoreOptions{
		Local: a.Redis != nil, MaxKeys: a.MaxKeys, Log: a.logger,
	})
	if err != nil {
		return err
	}
	rules, err := compileRules(cfg, policy, a.FleetSize, a.store.Store)
	if err != nil && a.XDS != nil {
		// Rules an earlier configuration accepted but this one cannot
		// compile: none until the server sends them again, to be NACKed.
		a.logger.Warn("rate limit service: the last rules received over xDS do not compile here", zap.Error(err))
		cfg = nil
		rules, err = compileRules(cfg, policy, a.FleetSize, a.store.Store)
	}
	if err != nil {
		return fmt.Errorf("config_dir: %w", err)
	}
	obsBase, err := a.store.ObserveConfig(ctx)
	if err != nil {
		return err
	}
	if err := rules.observeRules(ctx, obsBase); err != nil {
		return err
	}
	opt := limiter.Options{Log: a.logger, Local: a.store.Local}
	if a.Redis != nil {
		opt.Cache = limiter.NewDenyCache(limiter.DenyCacheOptions{Size: a.Redis.DenyCacheSize})
	}
	a.limiter = limiter.New(a.store.Store, opt)
	a.service = newService(rules, a.limiter, a.bounds(), a.logger)
	if err := a.followRules(ctx, policy, obsBase); err != nil {
		return err
	}
	a.logger.Info("rate limit service configured",
		zap.Strings("domains", cfg.Domains()), zap.Int("rules", len(cfg.Limits())))
	return nil
}

// followRules sets up how the service's rules follow their source once it
// runs: the xDS subscription, or the watcher of ConfigDir.
func (a *App) followRules(ctx caddy.Context, policy limiter.Policy, obsBase observe.Config) error {
	if a.XDS != nil {
		apply := func(cfg *config.Config) error {
			rs, err := compileRules(cfg, policy, a.FleetSize, a.store.Store)
			if err != nil {
				return err
			}
			if err := rs.observeRules(ctx, obsBase); err != nil {
				return err
			}
			if err := a.service.rules.Swap(rs).releaseObserved(); err != nil {
				a.logger.Warn("releasing the previous rules' statistics", zap.Error(err))
			}
			return nil
		}
		var err error
		if a.xds, err = newSubscription(a.XDS, apply, a.lastXDS, a.logger); err != nil {
			return fmt.Errorf("xds: %w", err)
		}
		return nil
	}
	every := time.Duration(a.ConfigRefreshInterval)
	if every == 0 {
		every = defaultRefreshInterval
	}
	a.watcher = &watcher{dir: a.ConfigDir, every: every, policy: policy, fleetSize: a.FleetSize,
		store: a.store.Store, service: a.service, logger: a.logger, ctx: ctx, obsBase: obsBase}
	return nil
}

// initialRules returns the rules the app starts with: ConfigDir's, or
// the last that the same xDS server and node sent an earlier
// configuration (none at the first).
func (a *App) initialRules() (*config.Config, error) {
	if a.XDS == nil {
		cfg, err := config.LoadDir(a.ConfigDir)
		if err != nil {
			return nil, fmt.Errorf("config_dir: %w", err)
		}
		return cfg, nil
	}
	v, _, err := lastXDSPool.LoadOrNew(lastXDSKey(a.XDS), func() (caddy.Destructor, error) {
		return new(lastXDS), nil
	})
	if err != nil {
		return nil, err
	}
	a.lastXDS = v.(*lastXDS)
	return a.lastXDS.get(), nil
}

// zonesFirst provisions Caddy's http app, whose rate_limit handlers
// publish their zones, before the rules that name a zone look it up.
func zonesFirst(ctx caddy.Context, cfg *config.Config) error {
	if !slices.ContainsFunc(cfg.Limits(), func(l *config.Limit) bool { return l.Zone != "" }) {
		return nil
	}
	if _, err := ctx.AppIfConfigured("http"); err != nil && !errors.Is(err, caddy.ErrNotConfigured) {
		return err
	}
	return nil
}

// Validate checks the configuration without reading files or connecting.
func (a *App) Validate() error {
	switch {
	case a.ConfigDir == "" && a.XDS == nil:
		return errors.New("config_dir or xds is required: the directory of envoyproxy/ratelimit's YAML files, " +
			"or the xDS server that sends the rules")
	case a.ConfigDir != "" && a.XDS != nil:
		return errors.New("config_dir and xds exclude each other: the rules come from files or over xDS")
	case a.FleetSize < 0:
		return limiter.ErrBadFleetSize
	case a.MaxKeys < 0 || a.MaxDescriptors < 0 || a.MaxEntries < 0 || a.MaxEntryBytes < 0:
		return errors.New("max_keys, max_descriptors, max_entries and max_entry_bytes must not be negative")
	case a.GracePeriod < 0 || a.ConfigRefreshInterval < 0:
		return errors.New("grace_period and config_refresh_interval must not be negative")
	}
	if _, err := limiter.ParsePolicy(a.OnError); err != nil {
		return fmt.Errorf("on_error must be local, deny or allow, got %q", a.OnError)
	}
	if _, err := a.addresses(); err != nil {
		return err
	}
	if a.TLS != nil {
		if err := a.TLS.validate(); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
	}
	if a.XDS != nil {
		if err := a.XDS.validate(); err != nil {
			return fmt.Errorf("xds: %w", err)
		}
	}
	if a.Redis != nil {
		if err := a.Redis.Validate(); err != nil {
			return fmt.Errorf("redis: %w", err)
		}
	}
	return nil
}

// Start opens the listeners, serves on them and watches ConfigDir or
// subscribes over xDS.
func (a *App) Start() error {
	if a.watcher != nil {
		a.watcher.start()
	}
	if a.xds != nil {
		if err := a.xds.start(); err != nil {
			return err
		}
	}
	addrs, _ := a.addresses() // validated
	for _, addr := range addrs {
		srv, err := a.startServer(addr)
		if err != nil {
			_ = a.Stop()
			return err
		}
		a.servers = append(a.servers, srv)
	}
	return nil
}

// Stop stops watching ConfigDir or ends the xDS subscription (the rules
// it received stay for the next configuration), and stops the servers: each stops
// accepting, tells its clients to go (HTTP/2 GOAWAY), and lets the calls in
// flight finish for at most GracePeriod.
func (a *App) Stop() error {
	if a.watcher != nil && a.watcher.stop != nil {
		a.watcher.close()
		a.watcher.stop = nil
	}
	if a.xds != nil {
		a.xds.close()
	}
	grace := time.Duration(a.GracePeriod)
	if grace == 0 {
		grace = defaultGracePeriod
	}
	for _, srv := range a.servers {
		srv.stop(grace)
	}
	a.servers = nil
	return nil
}

// Cleanup releases the limiter and the store; the last user of a store
// closes it.
func (a *App) Cleanup() error {
	var err error
	if a.service != nil {
		err = a.service.rules.Load().releaseObserved()
	}
	if a.limiter != nil {
		a.limiter.Close()
	}
	if a.lastXDS != nil {
		_, _ = lastXDSPool.Delete(lastXDSKey(a.XDS))
	}
	if a.store == nil {
		return err
	}
	return errors.Join(err, a.store.Release())
}

// defaultGracePeriod is GracePeriod's default.
const defaultGracePeriod = 5 * time.Second

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
