package testenv

import (
	"net/url"
	"testing"

	"github.com/outboxkit/outboxkit/internal/tcpproxy"
)

// Proxy is a TCP proxy in front of a service that a test can cut (every connection dropped, new
// ones refused) and restore, to provoke an outage without touching the shared server.
type Proxy = tcpproxy.Proxy

// NewProxy listens on a free loopback port and forwards to target (host:port) until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := tcpproxy.Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// ProxyURL returns rawURL with its host:port replaced by a new proxy's address.
func ProxyURL(t testing.TB, rawURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(t, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}
