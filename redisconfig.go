package fleetlimit

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// RedisConfig connects the handler to Redis. Handlers with the same
// connection settings share one client, which survives config reloads.
type RedisConfig struct {
	// Address is the server's host:port.
	Address string `json:"address,omitempty"`
	// Addresses are the seed nodes of a Redis Cluster (any reachable
	// node will do; the client discovers the rest).
	Addresses []string `json:"addresses,omitempty"`
	// Cluster selects Redis Cluster with a single seed Address. Several
	// addresses always mean a Cluster.
	Cluster bool `json:"cluster,omitempty"`
	// SentinelMaster is the master name that Redis Sentinel monitors:
	// set, the sentinels of SentinelAddresses tell the client where the
	// master is, also after a failover (instead of Address).
	SentinelMaster string `json:"sentinel_master,omitempty"`
	// SentinelAddresses are the sentinels' host:port, with
	// SentinelMaster ({env.*} placeholders are expanded).
	SentinelAddresses []string `json:"sentinel_addresses,omitempty"`
	// SentinelUsername is the ACL user on the sentinels, if they need one
	// ({env.*} placeholders are expanded).
	SentinelUsername string `json:"sentinel_username,omitempty"`
	// SentinelPassword authenticates to the sentinels ({env.*}
	// placeholders are expanded). It is never logged.
	SentinelPassword string `json:"sentinel_password,omitempty"`
	// Username is the ACL user; {env.*} placeholders are expanded.
	Username string `json:"username,omitempty"`
	// Password authenticates; {env.*} placeholders are expanded. It is
	// never logged.
	Password string `json:"password,omitempty"`
	// DB is the database number (not with a Cluster). Default: 0.
	DB int `json:"db,omitempty"`
	// TLS encrypts every connection (servers and sentinels).
	TLS *RedisTLS `json:"tls,omitempty"`
	// PoolSize is the most connections per Redis server and node.
	// Default: pipelines + 2 (one per pipeline, and two for the rest:
	// script loads, health checks, the fleet view).
	PoolSize int `json:"pool_size,omitempty"`
	// Pipelines is how many round trips to Redis a node keeps in flight at
	// once. The decisions that arrive while they are all out wait and go
	// together in the next one, as one script call. Default: 1, the least
	// CPU per decision on the node and in Redis; raise it for a distant
	// Redis, where a decision would otherwise wait up to a long round trip
	// for the one in flight.
	Pipelines int `json:"pipelines,omitempty"`
	// DialTimeout bounds opening a connection. Default: 1s. Provisioning
	// waits for the store's first connection and script load, at most
	// DialTimeout + Timeout when Redis does not answer, so that Caddy
	// serves on a connected store.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`
	// Protocol is the RESP version, 2 or 3. Default: 3, falling back to 2
	// when the server does not speak 3.
	Protocol int `json:"protocol,omitempty"`
	// DisableIdentity skips CLIENT SETINFO on connect, for proxies and
	// managed services that reject it (use with protocol 2 for those that
	// reject HELLO too).
	DisableIdentity bool `json:"disable_identity,omitempty"`
	// KeyPrefix starts every key the limiter writes. Default: `rl:`.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// Timeout is how long a decision waits for Redis, counted in the time
	// this node was able to run (wall time with DisableStallClock),
	// before each zone applies its on_error
	// policy. A node whose CPUs are saturated reads Redis' replies late,
	// and a Redis that has been answering slowly lately is given the time
	// it has been taking: neither is a failure, and the decision waits
	// (up to MaxWait) rather than letting requests through. Default: 25ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// MaxWait is the most a decision waits for Redis in wall time however
	// starved the node (a node frozen meanwhile first gets Timeout of
	// running time; never more than twice MaxWait). Default: 1s.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`
	// DisableStallClock switches off the stall clock, which tells a node
	// whose CPUs are saturated (it reads Redis' replies late) from a slow
	// Redis by how late its own timers fire. Off, Timeout counts wall
	// time: a starved node's decisions take their zones' on_error at
	// Timeout, as when Redis is slow, and the node saves the clock's
	// wake-up every 5ms. Default: false, the clock runs.
	DisableStallClock bool `json:"disable_stall_clock,omitempty"`
	// DenyCacheSize is how many denied buckets each node remembers, to
	// deny a flood on them without asking Redis until a token can be
	// there again (exact: tokens cannot appear sooner). Default: 65536.
	DenyCacheSize int `json:"deny_cache_size,omitempty"`
	// BreakerFailures is how many consecutive failed round trips to Redis
	// (however many decisions each carried) open the circuit breaker,
	// after which Redis is not called for
	// BreakerCooldown and every zone applies its failure policy at once.
	// Default: 5.
	BreakerFailures int `json:"breaker_failures,omitempty"`
	// BreakerCooldown is how long an open breaker keeps decisions away
	// from Redis; then one request probes it, and its success closes the
	// breaker. Default: 1s.
	BreakerCooldown caddy.Duration `json:"breaker_cooldown,omitempty"`
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// CA is a PEM file of the certificate authorities to trust. Default:
	// the system's.
	CA string `json:"ca,omitempty"`
	// Cert is a PEM file of a client certificate, for servers that
	// require one; with Key. Read again at every config load, so that a
	// certificate rotated in place is used after a reload.
	Cert string `json:"cert,omitempty"`
	// Key is the PEM file of Cert's private key.
	Key string `json:"key,omitempty"`
	// ServerName is the name to verify in the server's certificate.
	// Default: the host of the address.
	ServerName string `json:"server_name,omitempty"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// redisOptions are the resolved connection settings of a RedisConfig.
type redisOptions struct {
	limiter.RedisOptions
	tlsID []any // the TLS settings, for the pool key
}

// The redis settings that are a string, a flag, a duration or a count, by
// the name that the JSON and the Caddyfile give them: the Caddyfile adapter
// sets them through these tables, and validate checks the durations and
// counts. A zero duration or count is the limiter's default.
var (
	redisStrings = []setting[RedisConfig, string]{
		{"username", func(c *RedisConfig) *string { return &c.Username }},
		{"password", func(c *RedisConfig) *string { return &c.Password }},
		{"sentinel_username", func(c *RedisConfig) *string { return &c.SentinelUsername }},
		{"sentinel_password", func(c *RedisConfig) *string { return &c.SentinelPassword }},
		{"key_prefix", func(c *RedisConfig) *string { return &c.KeyPrefix }},
	}
	redisFlags = []setting[RedisConfig, bool]{
		{"cluster", func(c *RedisConfig) *bool { return &c.Cluster }},
		{"disable_identity", func(c *RedisConfig) *bool { return &c.DisableIdentity }},
		{"disable_stall_clock", func(c *RedisConfig) *bool { return &c.DisableStallClock }},
	}
	redisDurations = []setting[RedisConfig, caddy.Duration]{
		{"dial_timeout", func(c *RedisConfig) *caddy.Duration { return &c.DialTimeout }},
		{"timeout", func(c *RedisConfig) *caddy.Duration { return &c.Timeout }},
		{"max_wait", func(c *RedisConfig) *caddy.Duration { return &c.MaxWait }},
		{"breaker_cooldown", func(c *RedisConfig) *caddy.Duration { return &c.BreakerCooldown }},
	}
	redisCounts = []setting[RedisConfig, int]{
		{"pool_size", func(c *RedisConfig) *int { return &c.PoolSize }},
		{"pipelines", func(c *RedisConfig) *int { return &c.Pipelines }},
		{"breaker_failures", func(c *RedisConfig) *int { return &c.BreakerFailures }},
		{"deny_cache_size", func(c *RedisConfig) *int { return &c.DenyCacheSize }},
	}
)

// options resolves the connection settings of a validated configuration:
// {env.*} placeholders expanded and the TLS files read. Settings left zero
// stay zero: the limiter applies its defaults (limiter.RedisOptions), and
// refuses what expanding placeholders emptied.
func (c *RedisConfig) options() (redisOptions, error) {
	repl := caddy.NewReplacer()
	expand := func(v string) string { return repl.ReplaceKnown(v, "") }
	expandAll := func(vs []string) []string {
		out := make([]string, len(vs))
		for i, v := range vs {
			out[i] = expand(v)
		}
		return out
	}
	o := redisOptions{RedisOptions: limiter.RedisOptions{
		Address:           expand(c.Address),
		Addresses:         expandAll(c.Addresses),
		Cluster:           c.Cluster,
		SentinelMaster:    c.SentinelMaster,
		SentinelAddresses: expandAll(c.SentinelAddresses),
		SentinelUsername:  expand(c.SentinelUsername),
		SentinelPassword:  expand(c.SentinelPassword),
		Username:          expand(c.Username),
		Password:          expand(c.Password),
		DB:                c.DB,
		Protocol:          c.Protocol,
		DisableIdentity:   c.DisableIdentity,
		PoolSize:          c.PoolSize,
		Pipelines:         c.Pipelines,
		DialTimeout:       time.Duration(c.DialTimeout),
		KeyPrefix:         c.KeyPrefix,
		Timeout:           time.Duration(c.Timeout),
		MaxWait:           time.Duration(c.MaxWait),
		DisableStallClock: c.DisableStallClock,

		BreakerFailures: c.BreakerFailures,
		BreakerCooldown: time.Duration(c.BreakerCooldown),
	}}
	if c.TLS != nil {
		cfg, files, err := c.TLS.config()
		if err != nil {
			return o, fmt.Errorf("redis: tls: %w", err)
		}
		o.TLS = cfg
		o.tlsID = []any{c.TLS.CA, c.TLS.Cert, c.TLS.Key, c.TLS.ServerName, c.TLS.InsecureSkipVerify, files}
	}
	return o, nil
}

// config builds the TLS configuration, reading the files, and returns a
// digest of their contents: the pool key changes when a certificate is
// rotated in place, so that a reload connects with the new one.
func (t *RedisTLS) config() (*tls.Config, string, error) {
	h := sha256.New()
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // the operator's explicit choice, for tests
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, "", fmt.Errorf("reading ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("no certificate found in ca file %s", t.CA)
		}
		cfg.RootCAs = pool
		h.Write(pem)
	}
	if t.Cert != "" {
		certPEM, err := os.ReadFile(t.Cert)
		if err != nil {
			return nil, "", fmt.Errorf("reading cert: %w", err)
		}
		keyPEM, err := os.ReadFile(t.Key)
		if err != nil {
			return nil, "", fmt.Errorf("reading key: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, "", fmt.Errorf("loading client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		h.Write(certPEM)
		h.Write(keyPEM)
	}
	return cfg, hex.EncodeToString(h.Sum(nil)), nil
}

// poolKey identifies a connection configuration without revealing its
// secrets.
func (o redisOptions) poolKey() string {
	b, _ := json.Marshal([]any{o.Address, o.Addresses, o.Cluster, o.SentinelMaster, o.SentinelAddresses,
		o.SentinelUsername, o.SentinelPassword, o.Username, o.Password, o.DB, o.Protocol, o.DisableIdentity,
		o.PoolSize, o.Pipelines, o.DialTimeout, o.KeyPrefix, o.Timeout, o.MaxWait, o.DisableStallClock, o.BreakerFailures, o.BreakerCooldown, o.tlsID})
	sum := sha256.Sum256(b)
	return "redis:" + hex.EncodeToString(sum[:])
}
