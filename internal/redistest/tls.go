package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// TLSFiles are the PEM files of a test certificate authority and of a
// server and a client certificate it signed.
type TLSFiles struct {
	// CAFile is the CA certificate that signed both certificates.
	CAFile string
	// CertFile is the server's certificate, for 127.0.0.1, ::1 and
	// localhost; usable as a client certificate too.
	CertFile string
	// KeyFile is the private key of CertFile.
	KeyFile string
	// ClientCertFile is a client certificate the CA signed.
	ClientCertFile string
	// ClientKeyFile is the private key of ClientCertFile.
	ClientKeyFile string
	// ServerName is the name to verify the server's certificate against:
	// "localhost".
	ServerName string
}

// GenerateTLS writes a new CA, a server certificate and a client
// certificate (ECDSA P-256, valid for a day) to a temporary directory of
// the test.
func GenerateTLS(t T) *TLSFiles {
	t.Helper()
	dir := t.TempDir()
	f := &TLSFiles{
		CAFile:         filepath.Join(dir, "ca.crt"),
		CertFile:       filepath.Join(dir, "server.crt"),
		KeyFile:        filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.crt"),
		ClientKeyFile:  filepath.Join(dir, "client.key"),
		ServerName:     "localhost",
	}
	if err := f.generate(); err != nil {
		t.Fatalf("generating test certificates: %v", err)
	}
	return f
}

func (f *TLSFiles) generate() error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	ca := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		return err
	}
	if err := writePEM(f.CAFile, "CERTIFICATE", caDER); err != nil {
		return err
	}
	leaf := func(cn string, server bool, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if server {
			// Redis also presents its server certificate as a client
			// (replication, cluster bus), hence both usages.
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
			tmpl.DNSNames = []string{f.ServerName}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "PRIVATE KEY", keyDER)
	}
	if err := leaf(f.ServerName, true, f.CertFile, f.KeyFile); err != nil {
		return err
	}
	return leaf("redistest client", false, f.ClientCertFile, f.ClientKeyFile)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// ClientConfig returns a TLS client configuration that trusts the CA,
// verifies ServerName and presents the client certificate.
func (f *TLSFiles) ClientConfig() (*tls.Config, error) {
	caPEM, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", f.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCertFile, f.ClientKeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		RootCAs:      pool,
		ServerName:   f.ServerName,
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// StartTLS starts a redis-server that accepts TLS connections only (the
// plain port is off), with the server certificate of files, on a free
// loopback port, with extra configuration arguments, and stops it when
// the test ends. When requireClientCert is set, a client must present a
// certificate signed by the CA (tls-auth-clients yes). The Server's Do
// connects with files.ClientConfig().
func StartTLS(t T, files *TLSFiles, requireClientCert bool, extra ...string) *Server {
	t.Helper()
	cfg, err := files.ClientConfig()
	if err != nil {
		t.Fatalf("StartTLS: %v", err)
	}
	auth := "no"
	if requireClientCert {
		auth = "yes"
	}
	s := newServer(t, "redis-server (TLS)")
	s.TLS = cfg
	s.Password = passwordIn(extra)
	s.p.argv = append(append([]string{
		"--port", "0", "--tls-port", strconv.Itoa(s.Port),
		"--tls-cert-file", files.CertFile, "--tls-key-file", files.KeyFile,
		"--tls-ca-cert-file", files.CAFile, "--tls-auth-clients", auth,
	}, s.commonArgs()...), extra...)
	s.start()
	return s
}
