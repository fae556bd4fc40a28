package outbox_test

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// failoverAddr is a TCP address in front of whichever server is the
// primary, as a failover's virtual IP or DNS name is: moveTo points it at
// another server and cuts the connections it carried.
type failoverAddr struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
}

func newFailoverAddr(t *testing.T, target string) *failoverAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &failoverAddr{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		f.moveTo("")
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { f.serve(c) })
		}
	})
	return f
}

// Addr is the address clients connect to.
func (f *failoverAddr) Addr() string { return f.ln.Addr().String() }

// moveTo points the address at target and closes every connection open
// through it.
func (f *failoverAddr) moveTo(target string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target = target
	for c := range f.conns {
		c.Close()
	}
	clear(f.conns)
}

func (f *failoverAddr) serve(c net.Conn) {
	f.mu.Lock()
	target := f.target
	f.mu.Unlock()
	if target == "" {
		c.Close()
		return
	}
	up, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	f.mu.Lock()
	if f.target != target { // moved meanwhile
		f.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	f.conns[c], f.conns[up] = struct{}{}, struct{}{}
	f.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); up.Close(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); c.Close(); done <- struct{}{} }()
	<-done
	<-done
	f.mu.Lock()
	delete(f.conns, c)
	delete(f.conns, up)
	f.mu.Unlock()
}
