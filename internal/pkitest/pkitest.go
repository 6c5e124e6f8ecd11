// Package pkitest makes certificate authorities, certificates and keys for
// tests: a CA of the test's own, server and client certificates it signs,
// their PEM, the files a program under test reads them from, and the TLS
// configuration of a server that requires client certificates.
//
// Every key is a new ECDSA P-256 key, and every certificate is valid from
// an hour ago (a little clock skew between processes does not matter) for
// a day. The PEM forms are those that Go, OpenSSL (curl), GnuTLS
// (libvirtd), the docker CLI and Kubernetes all read: "CERTIFICATE" blocks
// and PKCS #8 "PRIVATE KEY" blocks.
//
// Making a key or signing a certificate fails only on a fault of this
// package's own; the functions that do panic then, so that a caller
// without a testing.TB can use them as they are.
package pkitest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CA is a certificate authority of the test's own: a self-signed CA
// certificate (basic constraints CA:TRUE, key usages certificate and CRL
// signing, as libvirtd requires of its CA) and its key.
type CA struct {
	// CertPEM is the CA's certificate in PEM: what a peer that trusts the
	// CA is given.
	CertPEM []byte

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Cert is a certificate that a CA issued, with its key.
type Cert struct {
	CertPEM []byte // the certificate alone, in PEM (no chain: peers trust the CA itself)
	KeyPEM  []byte // its private key, PKCS #8 in PEM

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA returns a new CA whose certificate's subject has the common name
// name. Two CAs made with the same name differ only in their keys: a
// certificate one of them signed names the other as its issuer too, and a
// peer that trusts the other must find its signature wrong.
func NewCA(name string) *CA {
	key := newKey()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	cert, certPEM := sign(tmpl, nil, &key.PublicKey, key)
	return &CA{CertPEM: certPEM, cert: cert, key: key}
}

// Pool returns a new pool holding the CA's certificate alone: RootCAs of a
// client that trusts the CA, ClientCAs of a server that does.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// Server issues a server certificate (extended key usage server
// authentication) for hosts, each an IP address (an IP address SAN) or a
// DNS name (a DNS SAN); the first is also its subject's common name. It
// panics without a host: a client would accept the certificate for none.
func (ca *CA) Server(hosts ...string) *Cert {
	if len(hosts) == 0 {
		panic("pkitest: a server certificate needs a host")
	}
	tmpl := leaf(hosts[0], x509.ExtKeyUsageServerAuth)
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(tmpl)
}

// Client issues a client certificate (extended key usage client
// authentication) whose subject has the common name name, as servers that
// take the common name for the client's identity read it. It has no SAN.
func (ca *CA) Client(name string) *Cert {
	return ca.issue(leaf(name, x509.ExtKeyUsageClientAuth))
}

// ServerConfig returns the TLS configuration of a server that presents
// server and requires every client to present a certificate that ca
// signed (as dockerd --tlsverify and libvirtd do), TLS 1.2 at least.
func (ca *CA) ServerConfig(server *Cert) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{server.TLSCertificate()},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
		MinVersion:   tls.VersionTLS12,
	}
}

// TLSCertificate returns the certificate and its key as crypto/tls takes
// them, with Leaf set.
func (c *Cert) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.cert.Raw}, PrivateKey: c.key, Leaf: c.cert}
}

// WriteFiles writes files (a file name → its content) into dir, each
// readable by its owner alone, making dir (owner only) when it does not
// exist. A name must be a plain file name, not a path.
func WriteFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range files {
		if name == "" || name == "." || name == ".." || strings.ContainsRune(name, filepath.Separator) {
			return fmt.Errorf("pkitest: %q is not a plain file name", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// leaf is the template of an end-entity certificate for usage. Its key
// usages are digital signature and key encipherment, the two that libvirtd
// requires of its own certificate and of its clients'.
func leaf(name string, usage x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{usage},
	}
}

func (ca *CA) issue(tmpl *x509.Certificate) *Cert {
	key := newKey()
	cert, certPEM := sign(tmpl, ca.cert, &key.PublicKey, ca.key)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		panic(fmt.Sprintf("pkitest: %v", err))
	}
	return &Cert{
		CertPEM: certPEM,
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		cert:    cert,
		key:     key,
	}
}

// sign makes the certificate of tmpl (self-signed when parent is nil) with
// a random serial number and the package's validity.
func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		panic(fmt.Sprintf("pkitest: %v", err))
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		panic(fmt.Sprintf("pkitest: %v", err))
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func newKey() *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(fmt.Sprintf("pkitest: %v", err))
	}
	return key
}
