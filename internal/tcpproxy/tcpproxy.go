// Package tcpproxy is a TCP proxy that cuts, freezes and restores the connections through it: the
// outage of a network path, provoked on purpose by the tests and the chaos soak.
package tcpproxy

import (
	"net"
	"sync"
	"sync/atomic"
)

// Proxy is a TCP proxy in front of a service that can be cut (every connection dropped, new
// ones refused) and restore, to provoke an outage of one client's connections without touching the shared server.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cut    bool
	frozen chan struct{}     // non-nil while frozen; closed by Thaw
	vanish bool              // frozen by Vanish: closes are held back too
	conns  map[net.Conn]bool // true for the clients' ends
	wg     sync.WaitGroup

	attempts atomic.Int64
}

// Listen listens on a free loopback port and forwards every connection to target (host:port)
// until Close.
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Close stops listening, drops every connection and waits for its goroutines.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Attempts counts the connections clients have opened to the proxy so far, those refused while it
// was cut included: how hard a client knocks during an outage.
func (p *Proxy) Attempts() int64 { return p.attempts.Load() }

// Open counts the clients' connections through the proxy that are open now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, client := range p.conns {
		if client {
			n++
		}
	}
	return n
}

// Cut drops every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.vanish = true, false
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// Freeze stops forwarding bytes while keeping every connection open: the peer sees a black hole
// (no reply, no error) until Thaw.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

// Vanish freezes the connections as a host that vanished does: no byte is forwarded, and no
// close either — a peer that closes its end leaves the other end open and silent — until Thaw
// (or Cut).
func (p *Proxy) Vanish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
	p.vanish = true
}

// Thaw forwards again what was held back.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.vanish = false
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen
}

// closeGate is what a close waits for: Thaw, while vanished.
func (p *Proxy) closeGate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.vanish {
		return nil
	}
	return p.frozen
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.attempts.Add(1)
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = client.Close()
			continue
		}
		p.mu.Unlock()
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.cut { // cut while dialing
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			continue
		}
		p.conns[client], p.conns[server] = true, false
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(client, server)
		go p.pipe(server, client)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if g := p.gate(); g != nil {
				<-g
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if g := p.closeGate(); g != nil {
		<-g
	}
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
