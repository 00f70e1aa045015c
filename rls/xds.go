package rls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// XDS subscribes to the rules over xDS, state of the world, as
// envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW and Envoy
// Gateway feeds its rate limit service: RateLimitConfig resources
// (ratelimit.config.ratelimit.v3, one domain each) on an aggregated
// discovery stream (ADS) from a management server. Every update replaces
// the whole set of rules. An update whose resources do not load is
// refused (NACK) with an error that names the resource and what is wrong,
// and the last good rules go on deciding; so they do while the server is
// away, and the stream is opened again with backoff.
type XDS struct {
	// Address is the management server, `host:port` or a gRPC target
	// (`dns:///envoy-gateway:18001`), as the reference's
	// CONFIG_GRPC_XDS_SERVER_URL. Required.
	Address string `json:"address,omitempty"`

	// NodeID is the node the service presents: the management server
	// answers the snapshot it keeps for this ID (Envoy Gateway's is
	// `envoy-ratelimit`), as CONFIG_GRPC_XDS_NODE_ID. Default: `default`,
	// the reference's.
	NodeID string `json:"node_id,omitempty"`

	// TLS connects to the management server over TLS, with a client
	// certificate for mutual TLS (as Envoy Gateway asks). Default:
	// plaintext.
	TLS *XDSTLS `json:"tls,omitempty"`

	// BackoffInitial is how long the service waits before it opens the
	// stream again after the server went away or refused it; each failed
	// attempt doubles the wait (with up to half of it added at random),
	// up to BackoffMax, and a stream that got an update starts over.
	// Default: 1s.
	BackoffInitial caddy.Duration `json:"backoff_initial,omitempty"`

	// BackoffMax is the longest wait between two attempts. Default: 30s.
	BackoffMax caddy.Duration `json:"backoff_max,omitempty"`
}

// XDSTLS is the TLS of the connection to the management server.
type XDSTLS struct {
	// CertFile and KeyFile are the PEM files of the client certificate
	// and its key that the service presents (CONFIG_GRPC_XDS_CLIENT_TLS_CERT
	// and _KEY). Default: none.
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
	// CAFile is the PEM file of the authorities that the server's
	// certificate must chain to (CONFIG_GRPC_XDS_SERVER_TLS_CACERT).
	// Default: the system's.
	CAFile string `json:"ca_file,omitempty"`
	// ServerName is the name the server's certificate must carry
	// (CONFIG_GRPC_XDS_SERVER_TLS_SAN). Default: the host of Address.
	ServerName string `json:"server_name,omitempty"`
}

// The defaults of XDS.
const (
	defaultNodeID         = "default"
	defaultBackoffInitial = time.Second
	defaultBackoffMax     = 30 * time.Second
)

// validate checks the settings without reading files or connecting.
func (x *XDS) validate() error {
	switch {
	case x.Address == "":
		return errors.New("address is required: the xDS management server")
	case x.BackoffInitial < 0 || x.BackoffMax < 0:
		return errors.New("backoff_initial and backoff_max must not be negative")
	case x.BackoffMax != 0 && x.BackoffMax < x.BackoffInitial:
		return errors.New("backoff_max must not be shorter than backoff_initial")
	case x.TLS != nil && (x.TLS.CertFile == "") != (x.TLS.KeyFile == ""):
		return errors.New("tls: cert_file and key_file go together")
	}
	return nil
}

// nodeID returns NodeID or its default.
func (x *XDS) nodeID() string {
	if x.NodeID == "" {
		return defaultNodeID
	}
	return x.NodeID
}

// backoff returns the first and the longest wait between attempts.
func (x *XDS) backoff() (initial, longest time.Duration) {
	initial, longest = time.Duration(x.BackoffInitial), time.Duration(x.BackoffMax)
	if initial == 0 {
		initial = defaultBackoffInitial
	}
	if longest == 0 {
		longest = max(defaultBackoffMax, initial)
	}
	return initial, longest
}

// config reads the files and builds the client's TLS configuration (at
// least TLS 1.2).
func (t *XDSTLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading cert_file and key_file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate found in ca_file %s", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
