package rls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLS serves gRPC over TLS. The files are read at every config load, so a
// certificate rotated in place is served after `caddy reload`.
type TLS struct {
	// Listen are the addresses that serve TLS, in Caddy's network address
	// form (`:8443`). Required.
	Listen []string `json:"listen,omitempty"`
	// CertFile is the PEM file of the server's certificate chain.
	// Required.
	CertFile string `json:"cert_file,omitempty"`
	// KeyFile is the PEM file of the certificate's private key. Required.
	KeyFile string `json:"key_file,omitempty"`
	// ClientCAFile, when set, makes the TLS mutual: a client must present
	// a certificate signed by one of this PEM file's authorities, or the
	// handshake fails. Default: no client certificate asked for.
	ClientCAFile string `json:"client_ca_file,omitempty"`
}

// validate checks the settings without reading the files.
func (t *TLS) validate() error {
	switch {
	case len(t.Listen) == 0:
		return errors.New("listen is required: the addresses that serve TLS")
	case t.CertFile == "" || t.KeyFile == "":
		return errors.New("cert_file and key_file are required")
	}
	return nil
}

// config reads the files and builds the server's TLS configuration (at
// least TLS 1.2; gRPC adds the h2 protocol).
func (t *TLS) config() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("loading cert_file and key_file: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("reading client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate found in client_ca_file %s", t.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
