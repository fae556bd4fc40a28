package chaos

import (
	"bufio"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// commitReplyWait bounds how long a COMMIT cut waits for the server's answer
// (which it withholds from the client) before cutting anyway.
const commitReplyWait = 5 * time.Second

// PGProxyStats counts what a PGProxy did.
type PGProxyStats struct {
	Conns       int64 // client connections accepted (pgx's CancelRequests included)
	Drops       int64 // connections the proxy cut, by DropRandom or at a COMMIT
	CommitDrops int64 // of Drops, those cut at a COMMIT
}

// PGProxy is a TCP proxy in front of a PostgreSQL server that can cut
// connections, at random or right after a COMMIT reached the server and
// before the server's answer reaches the client: the client then sees its
// connection fail with the outcome unknown, while the server committed.
//
// The proxy follows the frontend protocol (the startup phase, then typed
// messages) to know message boundaries and spot COMMITs, sent as a simple
// Query or through Parse/Bind/Execute (see isCommitSQL); it forwards bytes
// unchanged and does not parse the server's side. A connection that
// negotiates TLS or GSS encryption is relayed opaquely and never cut at a
// COMMIT. Each client connection dials the target anew, so the proxy keeps
// working across a restart of the server behind it.
type PGProxy struct {
	target atomic.Pointer[string]
	ln     net.Listener

	commitDropRate atomic.Uint64 // float64 bits
	conns          atomic.Int64
	drops          atomic.Int64
	commitDrops    atomic.Int64

	mu     sync.Mutex
	live   map[*proxyConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewPGProxy listens on a free port of 127.0.0.1 and forwards each client
// connection to target (host:port).
func NewPGProxy(target string) (*PGProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &PGProxy{ln: ln, live: map[*proxyConn]struct{}{}}
	p.target.Store(&target)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients connect to, host:port.
func (p *PGProxy) Addr() string { return p.ln.Addr().String() }

// SetCommitDropRate makes the proxy cut a connection at a COMMIT with
// probability rate (0 never, 1 always): it forwards the COMMIT to the server,
// waits for the server's answer without relaying it, and closes both sides.
func (p *PGProxy) SetCommitDropRate(rate float64) {
	p.commitDropRate.Store(math.Float64bits(rate))
}

// DropRandom cuts up to n live sessions chosen at random, now, and returns
// how many it cut. A session is a connection past its StartupMessage (a
// CancelRequest's connection is not one).
func (p *PGProxy) DropRandom(n int) int {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.live))
	for c := range p.live {
		if c.session.Load() {
			conns = append(conns, c)
		}
	}
	p.mu.Unlock()
	rand.Shuffle(len(conns), func(i, j int) { conns[i], conns[j] = conns[j], conns[i] })
	cut := 0
	for _, c := range conns[:min(n, len(conns))] {
		if c.cut() {
			cut++
		}
	}
	p.drops.Add(int64(cut))
	return cut
}

// Retarget points the proxy at another server, as a failover moves a
// virtual IP or HAProxy marks the old primary down: new connections go to
// target, and every connection to the old server is cut (HAProxy's
// on-marked-down shutdown-sessions), so no client keeps writing to a
// primary that has been replaced. It returns how many it cut.
func (p *PGProxy) Retarget(target string) int {
	p.target.Store(&target)
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.live))
	for c := range p.live {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	cut := 0
	for _, c := range conns {
		if c.cut() {
			cut++
		}
	}
	return cut
}

// Stats returns the proxy's counts so far.
func (p *PGProxy) Stats() PGProxyStats {
	return PGProxyStats{Conns: p.conns.Load(), Drops: p.drops.Load(), CommitDrops: p.commitDrops.Load()}
}

// Close stops accepting, cuts every connection and waits for the proxy's
// goroutines to end.
func (p *PGProxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.live))
	for c := range p.live {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range conns {
		c.cut()
	}
	p.wg.Wait()
}

func (p *PGProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.conns.Add(1)
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(client)
	}
}

// serve dials the target for client and relays until either side ends or
// the proxy cuts the pair.
func (p *PGProxy) serve(client net.Conn) {
	defer p.wg.Done()
	target := *p.target.Load()
	server, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &proxyConn{proxy: p, client: client, server: server, replied: make(chan struct{}), gone: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.cut()
		return
	}
	p.live[c] = struct{}{}
	p.mu.Unlock()
	if *p.target.Load() != target { // retargeted while dialing: a connection to the old server
		c.cut()
	}
	defer func() {
		p.mu.Lock()
		delete(p.live, c)
		p.mu.Unlock()
	}()
	c.run()
}

// dropCommit draws whether to cut at this COMMIT.
func (p *PGProxy) dropCommit() bool {
	rate := math.Float64frombits(p.commitDropRate.Load())
	return rate > 0 && rand.Float64() < rate
}

// proxyConn is one client connection and its server connection.
type proxyConn struct {
	proxy  *PGProxy
	client net.Conn
	server net.Conn

	session   atomic.Bool   // past the StartupMessage
	holding   atomic.Bool   // a COMMIT is being cut: relay nothing more to the client
	replied   chan struct{} // closed when the server answered (or ended) while holding
	replyOnce sync.Once
	gone      chan struct{} // closed by cut
	cutOnce   sync.Once
}

// cut closes both sides; it reports whether this call did it.
func (c *proxyConn) cut() (did bool) {
	c.cutOnce.Do(func() {
		did = true
		close(c.gone)
		_ = c.client.Close()
		_ = c.server.Close()
	})
	return did
}

// run relays both directions until the pair ends.
func (c *proxyConn) run() {
	defer c.cut()
	toClient := make(chan struct{})
	cr := bufio.NewReaderSize(c.client, 32<<10)
	opaque, err := c.startup(cr)
	if err != nil {
		return
	}
	go func() {
		defer close(toClient)
		c.relayToClient()
	}()
	if opaque {
		_, _ = io.Copy(c.server, cr)
	} else {
		c.forward(cr)
	}
	c.cut()
	<-toClient
}

// startup relays the untyped startup phase: SSL or GSS encryption requests
// (answered by one byte from the server) and the StartupMessage. It reports
// opaque when the connection goes encrypted (or is a CancelRequest), after
// which its bytes cannot be followed.
func (c *proxyConn) startup(cr *bufio.Reader) (opaque bool, err error) {
	for {
		first, err := cr.Peek(1)
		if err != nil {
			return false, err
		}
		if first[0] == 0x16 { // a TLS handshake without SSLRequest (direct SSL)
			c.session.Store(true)
			return true, nil
		}
		m, code, err := readStartupMessage(cr)
		if err != nil {
			return false, err
		}
		if _, err := c.server.Write(m.raw); err != nil {
			return false, err
		}
		switch code {
		case pgSSLRequest, pgGSSENCRequest:
			var answer [1]byte
			if _, err := io.ReadFull(c.server, answer[:]); err != nil {
				return false, err
			}
			if _, err := c.client.Write(answer[:]); err != nil {
				return false, err
			}
			if answer[0] != 'N' { // 'S' or 'G': encrypted from here on
				c.session.Store(true)
				return true, nil
			}
		case pgCancelRequest:
			return true, nil
		default:
			c.session.Store(true)
			return false, nil
		}
	}
}

// forward relays the client's typed messages to the server, flushing
// whenever the client has nothing more buffered, and cuts the pair at a
// COMMIT when the drop rate says so.
func (c *proxyConn) forward(cr *bufio.Reader) {
	sw := bufio.NewWriterSize(c.server, 32<<10)
	commits := newCommitTracker()
	dropping := false
	for {
		m, err := readMessage(cr)
		if err != nil {
			return
		}
		if commits.commits(m) && !dropping && c.proxy.dropCommit() {
			dropping = true
			c.holding.Store(true) // before the COMMIT can reach the server
		}
		if _, err := sw.Write(m.raw); err != nil {
			return
		}
		// A simple Query runs at once; an extended COMMIT is answered at the
		// next Sync or Flush.
		cutNow := dropping && (m.typ == 'Q' || m.typ == 'S' || m.typ == 'H')
		if cutNow || cr.Buffered() == 0 {
			if err := sw.Flush(); err != nil {
				return
			}
		}
		if cutNow {
			c.cutAtCommit()
			return
		}
	}
}

// cutAtCommit waits until the server answered the COMMIT just sent (the
// answer is withheld from the client), then cuts both sides.
func (c *proxyConn) cutAtCommit() {
	t := time.NewTimer(commitReplyWait)
	defer t.Stop()
	select {
	case <-c.replied:
	case <-c.gone:
		return // DropRandom or Close cut it meanwhile
	case <-t.C:
	}
	// Count first: the client may read Stats as soon as it sees the cut.
	c.proxy.drops.Add(1)
	c.proxy.commitDrops.Add(1)
	c.cut()
}

// relayToClient copies the server's bytes to the client, withholding them
// once a COMMIT is being cut.
func (c *proxyConn) relayToClient() {
	defer c.cut()
	defer c.replyOnce.Do(func() { close(c.replied) })
	buf := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			if c.holding.Load() {
				c.replyOnce.Do(func() { close(c.replied) })
			} else if _, err := c.client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
