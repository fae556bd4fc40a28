package bench

import (
	"context"
	"net"
	"os"
	"sync/atomic"
)

var getenv = os.Getenv

// edgeTripConn counts PostgreSQL round trips: each run of writes after a
// read (the server's answer) is one.
type edgeTripConn struct {
	net.Conn
	trips     *atomic.Int64
	lastWrite atomic.Bool
}

func (c *edgeTripConn) Write(p []byte) (int, error) {
	if !c.lastWrite.Swap(true) {
		c.trips.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *edgeTripConn) Read(p []byte) (int, error) {
	c.lastWrite.Store(false)
	return c.Conn.Read(p)
}

// edgeCountingDialer dials PostgreSQL with round-trip counting.
func edgeCountingDialer(trips *atomic.Int64) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &edgeTripConn{Conn: c, trips: trips}, nil
	}
}
