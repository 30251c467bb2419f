package main

// The server's loopback connection (its own clients: admission's informers, the RBAC
// authorizer's informers, post-start hooks) as k8s.io/apiserver sets it up
// (pkg/server/options/serving_with_loopback.go of v0.36.4, SecureServingOptionsWithLoopback.applyTo),
// but with ECDSA P-256 keys where k8s.io/client-go's certutil.GenerateSelfSignedCertKeyWithOptions
// generates two RSA 2048 keys: their prime search took 100-400 ms of every start, on the
// path of every test process's first request. The certificates are otherwise the same: a
// self-signed CA and a serving certificate it signs for the loopback server name, the
// chain handed to the loopback client as its CA. Not added: the loopback certificate's
// expiry health check (the certificate outlives any test server by years).

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	cryptorand "crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"time"

	"github.com/google/uuid"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericoptions "k8s.io/apiserver/pkg/server/options"
)

// loopbackCertificateAge is maxAge of serving_with_loopback.go.
const loopbackCertificateAge = (3*365 + 1) * 24 * time.Hour

// applySecureServing applies the serving options to cfg and gives it a loopback client
// configuration trusting a fresh self-signed certificate served for the loopback name.
func applySecureServing(s *genericoptions.SecureServingOptionsWithLoopback, cfg *genericapiserver.Config) error {
	if s == nil || s.SecureServingOptions == nil {
		return nil
	}
	if err := s.SecureServingOptions.ApplyTo(&cfg.SecureServing); err != nil {
		return err
	}
	if cfg.SecureServing == nil {
		return nil
	}
	certPem, keyPem, err := selfSignedCertKey(genericapiserver.LoopbackClientServerNameOverride, loopbackCertificateAge)
	if err != nil {
		return fmt.Errorf("failed to generate self-signed certificate for loopback connection: %v", err)
	}
	provider, err := dynamiccertificates.NewStaticSNICertKeyContent("self-signed loopback", certPem, keyPem,
		genericapiserver.LoopbackClientServerNameOverride)
	if err != nil {
		return fmt.Errorf("failed to generate self-signed certificate for loopback connection: %v", err)
	}
	// First, so that it overrides any other certificate for the same name.
	cfg.SecureServing.SNICerts = append([]dynamiccertificates.SNICertKeyContentProvider{provider}, cfg.SecureServing.SNICerts...)
	loopback, err := cfg.SecureServing.NewLoopbackClientConfig(uuid.New().String(), certPem)
	switch {
	case err != nil && cfg.LoopbackClientConfig == nil:
		cfg.SecureServing.SNICerts = cfg.SecureServing.SNICerts[1:]
		return err
	case err != nil:
		// A fallback loopback configuration exists: keep it.
	default:
		cfg.LoopbackClientConfig = loopback
	}
	return nil
}

// selfSignedCertKey is certutil.GenerateSelfSignedCertKeyWithOptions (k8s.io/client-go
// util/cert/cert.go of v0.36.4) for a DNS host, with ECDSA P-256 keys: the serving
// certificate and its CA as a PEM chain, and the serving key.
func selfSignedCertKey(host string, maxAge time.Duration) ([]byte, []byte, error) {
	validFrom := time.Now().Add(-time.Hour) // valid an hour earlier against clock skew
	serial := func() (*big.Int, error) {
		n, err := cryptorand.Int(cryptorand.Reader, new(big.Int).SetInt64(math.MaxInt64-1))
		if err != nil {
			return nil, err
		}
		return n.Add(n, big.NewInt(1)), nil
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caSerial, err := serial()
	if err != nil {
		return nil, nil, err
	}
	caTemplate := x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s-ca@%d", host, time.Now().Unix())},
		NotBefore:             validFrom,
		NotAfter:              validFrom.Add(maxAge),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(cryptorand.Reader, &caTemplate, &caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		return nil, nil, err
	}
	leafSerial, err := serial()
	if err != nil {
		return nil, nil, err
	}
	template := x509.Certificate{
		SerialNumber:          leafSerial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s@%d", host, time.Now().Unix())},
		NotBefore:             validFrom,
		NotAfter:              validFrom.Add(maxAge),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{host},
	}
	der, err := x509.CreateCertificate(cryptorand.Reader, &template, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})...)
	return chain, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
