package testenv

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections to an upstream address until Cut: a
// server a test can take away (connections dropped, new ones refused)
// without stopping it for the other tests.
type Proxy struct {
	Addr string // host:port to connect to instead of the upstream

	ln       net.Listener
	upstream string
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	cut      bool
}

// StartProxy listens on a free local port and forwards to upstream until
// Cut or the test's end.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	go p.accept()
	t.Cleanup(p.Cut)
	return p
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *Proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
	_, _ = io.Copy(c, up)
	_ = c.Close()
}

// track registers a proxied pair; false (both closed) once cut.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// Cut closes the listener (new connections are refused) and every
// connection through it. It is idempotent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
}

// StartBlackhole listens on a free local port, accepts connections and
// never answers them (a server that hangs), until the test's end. It
// returns the address.
func StartBlackhole(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
