// Package kafkabackend_test holds the Kafka backend's tests that need a broker of their own: an
// in-process kfake whose listener wants TLS (a CA of the test's own), SASL, or both. They live in
// the integration module so that kfake is no requirement of the library's module; the URL
// parsing's tests stay in backends/kafkabackend.
package kafkabackend_test

import (
	"bytes"
	"context"
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
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	_ "github.com/outboxkit/outboxkit/backends/kafkabackend" // kafka:// URLs
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// secureCluster is an in-process Kafka whose listener wants TLS (a certificate of a CA of the
// test's own), SASL, or both, with a user for each mechanism.
type secureCluster struct {
	*kfake.Cluster
	addr   string
	caFile string // the CA's certificate, PEM
}

// clusterUsers are the cluster's users by SASL mechanism, as a kafka:// URL's sasl= names them.
var clusterUsers = map[string][2]string{
	"PLAIN":         {"plain-app", "plain-secret"},
	"SCRAM-SHA-256": {"s256-app", "s256-secret"},
	"SCRAM-SHA-512": {"s512-app", "s512-secret"},
}

// mechanisms are the SASL mechanisms the backend speaks.
var mechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

func newSecureCluster(t *testing.T, withTLS, withSASL bool, topics ...string) secureCluster {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(2, topics...)}
	var sc secureCluster
	if withTLS {
		var serverCfg *tls.Config
		serverCfg, sc.caFile = testCA(t)
		opts = append(opts, kfake.TLS(serverCfg))
	}
	if withSASL {
		opts = append(opts, kfake.EnableSASL())
		for m, up := range clusterUsers {
			opts = append(opts, kfake.Superuser(m, up[0], up[1]))
		}
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	sc.Cluster, sc.addr = c, c.ListenAddrs()[0]
	return sc
}

// testCA makes a CA and a server certificate for 127.0.0.1 signed by it; it returns the server's
// TLS configuration and the path of the CA's certificate.
func testCA(t *testing.T) (*tls.Config, string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, srvKey := key(), key()
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outboxkit test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kafka"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames: []string{"localhost"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}}}, caFile
}

// url is a kafka:// URL of the cluster; query is added as it is.
func (sc secureCluster) url(user, password, query string) string {
	u := "kafka://"
	if user != "" {
		u += url.UserPassword(user, password).String() + "@"
	}
	return u + sc.addr + "?" + query
}

type checkingPublisher interface {
	message.Publisher
	Check(ctx context.Context) error
}

// Every client of the backend — the producer and its start check, a group member and its check,
// the lag reader — speaks TLS and SASL as the URL says, with each mechanism.
func TestKafka_TLSAndSASL_EveryClientAuthenticates(t *testing.T) {
	t.Parallel()
	topic := "secure-orders"
	sc := newSecureCluster(t, true, true, topic)
	for _, m := range mechanisms {
		t.Run(m, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			up := clusterUsers[m]
			b, err := backends.Open(ctx, sc.url(up[0], up[1], "tls_ca="+url.QueryEscape(sc.caFile)+"&sasl="+m), backends.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if err := b.Publisher.(checkingPublisher).Check(ctx); err != nil {
				t.Fatalf("Check: %v", err)
			}
			msg := message.NewMessage(fmt.Sprintf("evt-%s", m), []byte(`{"order":1}`))
			if err := b.Publisher.Publish(topic, msg); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			sub, err := b.NewSubscriber("billing-" + strings.ToLower(m))
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			ch, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatalf("Subscribe: %v", err)
			}
			for {
				select {
				case got := <-ch:
					got.Ack()
					if got.UUID != msg.UUID {
						continue // another mechanism's event: the topic is shared
					}
				case <-ctx.Done():
					t.Fatalf("%s never arrived over TLS and SASL/%s", msg.UUID, m)
				}
				break
			}
			lag, err := b.Lag(ctx, topic, "billing-"+strings.ToLower(m))
			if err != nil {
				t.Fatalf("Lag: %v", err)
			}
			t.Logf("lag read over TLS and SASL/%s: %+v", m, lag)
		})
	}
}

// A refused password is said at start, by the forwarder's check and a consumer's first Subscribe,
// as outboxkit.AccessDenied — not retried as an outage.
func TestKafka_RefusedCredentialsFailAtStart(t *testing.T) {
	t.Parallel()
	sc := newSecureCluster(t, true, true, "denied-orders")
	// Kafka answers a wrong password with SASL_AUTHENTICATION_FAILED, then closes the connection;
	// kfake only closes it. Make it answer as Kafka does, in Kafka's words.
	sc.ControlKey(int16(kmsg.SASLAuthenticate), func(req kmsg.Request) (kmsg.Response, error, bool) {
		sc.KeepControl()
		auth := req.(*kmsg.SASLAuthenticateRequest)
		parts := bytes.Split(auth.SASLAuthBytes, []byte{0}) // PLAIN: authzid NUL user NUL password
		if len(parts) != 3 || string(parts[2]) == clusterUsers["PLAIN"][1] {
			return nil, nil, false
		}
		resp := auth.ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := "Authentication failed: Invalid username or password"
		resp.ErrorMessage = &msg
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := backends.Open(ctx, sc.url(clusterUsers["PLAIN"][0], "wrong", "tls_ca="+url.QueryEscape(sc.caFile)+"&sasl=PLAIN"), backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	err = b.Publisher.(checkingPublisher).Check(ctx)
	if !outboxkit.IsAccessDenied(err) || outboxkit.IsUnreachable(err) {
		t.Fatalf("Check = %v; want an access-denied error, not an outage", err)
	}
	t.Logf("Check after %s: %v", time.Since(start).Round(time.Millisecond), err)
	sub, err := b.NewSubscriber("billing")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	start = time.Now()
	_, err = sub.Subscribe(ctx, "denied-orders")
	if !outboxkit.IsAccessDenied(err) {
		t.Fatalf("Subscribe = %v; want an access-denied error", err)
	}
	t.Logf("Subscribe after %s: %v", time.Since(start).Round(time.Millisecond), err)
}

// A server certificate the client does not trust is said at start too: trying again will not help.
func TestKafka_UntrustedServerCertificateFailsAtStart(t *testing.T) {
	t.Parallel()
	sc := newSecureCluster(t, true, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := backends.Open(ctx, sc.url("", "", "tls=true"), backends.Options{}) // the system's roots: not the test CA
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = b.Publisher.(checkingPublisher).Check(ctx)
	if !outboxkit.IsAccessDenied(err) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Check = %v; want an access-denied error about the certificate", err)
	}
	t.Log(err)
}

// A plaintext, unauthenticated client of a listener that wants TLS or SASL has its connection
// closed as soon as it speaks: the error says what the URL did not ask for (and stays an outage,
// as a proxy whose broker is down does the same).
func TestKafka_ClosedAtOnceSaysWhatTheURLDidNotAskFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		withTLS, sasl bool
		want          string
	}{
		{"TLS listener", true, false, "tls=true"},
		{"SASL listener", false, true, "sasl=<mechanism>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := newSecureCluster(t, tc.withTLS, tc.sasl, "plain-orders")
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			logs := watermill.NewCaptureLogger()
			b, err := backends.Open(ctx, sc.url("", "", ""), backends.Options{Logger: logs})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			err = b.Publisher.(checkingPublisher).Check(cctx)
			ccancel()
			if !outboxkit.IsUnreachable(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v; want an unreachable error naming %s", err, tc.want)
			}
			t.Log(err)
			// A consumer whose broker does not answer subscribes in the background and logs why,
			// with the same explanation.
			sub, err := b.NewSubscriber("billing")
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			if _, err := sub.Subscribe(ctx, "plain-orders"); err != nil {
				t.Fatalf("Subscribe = %v; want it to go on in the background", err)
			}
			var logged string
			testenv.Eventually(t, 30*time.Second, "the subscriber to log why it cannot subscribe", func() bool {
				for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
					if m.Err != nil && strings.Contains(m.Err.Error(), tc.want) {
						logged = m.Err.Error()
						return true
					}
				}
				return false
			})
			t.Log(logged)
		})
	}
}
