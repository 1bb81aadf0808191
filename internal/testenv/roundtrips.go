package testenv

import (
	"context"
	"net"
	"sync"
	"time"
)

// RoundTrips counts the round trips clients make over the connections it wraps: one each time a
// client, having sent something, reads the first bytes of the answer. Several messages written
// before reading (a pipeline, a batch) are one round trip; bytes the server sends unasked (a
// notification, a parameter status) are none. It counts what a client waits for, which is what a
// transaction pays at one client, whatever the machine's speed.
type RoundTrips struct {
	mu sync.Mutex
	n  int
}

// Take returns the round trips counted since the last Take.
func (r *RoundTrips) Take() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.n
	r.n = 0
	return n
}

// Dial dials as net.Dialer does and counts the connection's round trips: pgx's
// ConnConfig.DialFunc.
func (r *RoundTrips) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, r: r}, nil
}

// Dialer is a lib/pq dialer (pq.Connector.Dialer) that counts the connections' round trips.
func (r *RoundTrips) Dialer() PQDialer { return PQDialer{r} }

// PQDialer is RoundTrips as lib/pq's pq.Dialer and pq.DialerContext.
type PQDialer struct{ r *RoundTrips }

func (d PQDialer) Dial(network, addr string) (net.Conn, error) {
	return d.r.Dial(context.Background(), network, addr)
}

func (d PQDialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.r.Dial(ctx, network, addr)
}

func (d PQDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.r.Dial(ctx, network, addr)
}

type countedConn struct {
	net.Conn
	r *RoundTrips
	// sent: written since the last answer began. Guarded by r.mu: pgx may read on a goroutine of
	// its own while it writes.
	sent bool
}

func (c *countedConn) Write(b []byte) (int, error) {
	c.r.mu.Lock()
	c.sent = true
	c.r.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.r.mu.Lock()
		if c.sent {
			c.sent = false
			c.r.n++
		}
		c.r.mu.Unlock()
	}
	return n, err
}
