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

// options resolves the connection settings: {env.*} placeholders expanded,
// checked, and defaults applied.
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
	switch {
	case o.Address == "" && len(o.Addresses) == 0 && o.SentinelMaster == "":
		return o, errors.New("rate_limit: redis: address is required")
	case o.SentinelMaster != "" && len(o.SentinelAddresses) == 0:
		return o, errors.New("rate_limit: redis: sentinel_master needs sentinel_addresses")
	case o.SentinelMaster != "" && (o.Address != "" || len(o.Addresses) > 0):
		return o, errors.New("rate_limit: redis: give either sentinels or server addresses, not both")
	case o.DB < 0:
		return o, errors.New("rate_limit: redis: db must not be negative")
	case o.Timeout < 0 || o.DialTimeout < 0:
		return o, errors.New("rate_limit: redis: timeout must not be negative")
	case o.MaxWait < 0:
		return o, errors.New("rate_limit: redis: max_wait must not be negative")
	case o.BreakerFailures < 0 || o.BreakerCooldown < 0:
		return o, errors.New("rate_limit: redis: breaker_failures and breaker_cooldown must not be negative")
	case o.PoolSize < 0:
		return o, errors.New("rate_limit: redis: pool_size must not be negative")
	case o.Pipelines < 0:
		return o, errors.New("rate_limit: redis: pipelines must not be negative")
	case o.Protocol != 0 && o.Protocol != 2 && o.Protocol != 3:
		return o, errors.New("rate_limit: redis: protocol must be 2 or 3")
	case (o.Cluster || len(o.Addresses) > 0) && o.DB != 0:
		return o, errors.New("rate_limit: redis: a Cluster has only db 0")
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "rl:"
	}
	if o.Timeout == 0 {
		o.Timeout = 25 * time.Millisecond
	}
	if c.TLS != nil {
		cfg, files, err := c.TLS.config()
		if err != nil {
			return o, fmt.Errorf("rate_limit: redis: tls: %w", err)
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
	if (t.Cert == "") != (t.Key == "") {
		return nil, "", errors.New("a client certificate needs both cert and key")
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
