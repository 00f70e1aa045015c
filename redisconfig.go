package fleetlimit

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

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

// validate checks the connection settings as configured (before {env.*}
// placeholders are expanded). The Caddyfile adapter calls it at the end of
// the redis block, and provisioning before connecting.
func (c *RedisConfig) validate() error {
	servers := c.Address != "" || len(c.Addresses) > 0
	switch {
	case !servers && c.SentinelMaster == "":
		return inSetting("address", errors.New("address is required: a server, a Cluster's nodes, or a Sentinel master and its sentinels"))
	case c.SentinelMaster != "" && len(c.SentinelAddresses) == 0:
		return inSetting("sentinel", errors.New("a Sentinel master needs at least one sentinel address"))
	case c.SentinelMaster != "" && servers:
		return inSetting("sentinel", errors.New("give either sentinels or server addresses, not both: the sentinels find the master"))
	case c.SentinelMaster != "" && c.Cluster:
		return inSetting("cluster", errors.New("cluster and sentinel exclude each other: a Cluster has no Sentinel"))
	case c.DB < 0:
		return inSetting("db", errors.New("db must not be negative"))
	case c.DB != 0 && (c.Cluster || len(c.Addresses) > 0):
		return inSetting("db", errors.New("a Cluster has only db 0"))
	case c.Protocol != 0 && c.Protocol != 2 && c.Protocol != 3:
		return inSetting("protocol", fmt.Errorf("protocol must be 2 or 3, got %d", c.Protocol))
	}
	if err := limiter.CheckKeyPrefix(c.KeyPrefix); err != nil {
		return inSetting("key_prefix", err)
	}
	for _, s := range redisDurations {
		if *s.field(c) < 0 {
			return inSetting(s.name, fmt.Errorf("%s must not be negative", s.name))
		}
	}
	for _, s := range redisCounts {
		if *s.field(c) < 0 {
			return inSetting(s.name, fmt.Errorf("%s must not be negative", s.name))
		}
	}
	if c.TLS != nil {
		if err := c.TLS.validate(); err != nil {
			return fmt.Errorf("tls: %w", err)
		}
	}
	return nil
}

// validate checks the TLS settings without reading the files.
func (t *RedisTLS) validate() error {
	switch {
	case t.Cert != "" && t.Key == "":
		return inSetting("cert", errors.New("a client certificate needs both cert and key"))
	case t.Key != "" && t.Cert == "":
		return inSetting("key", errors.New("a client certificate needs both cert and key"))
	}
	return nil
}

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
		o.PoolSize, o.Pipelines, o.DialTimeout, o.KeyPrefix, o.Timeout, o.MaxWait, o.BreakerFailures, o.BreakerCooldown, o.tlsID})
	sum := sha256.Sum256(b)
	return "redis:" + hex.EncodeToString(sum[:])
}
