package oncekittest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// NATS is a connection to a real JetStream-enabled server.
type NATS struct {
	// URL is the server's client URL.
	URL string
	// Conn is a connection to it, closed when the test ends.
	Conn *nats.Conn
	// JS is JetStream on Conn.
	JS jetstream.JetStream
}

// NewNATS connects to NATS_URL when it is set (tests then keep apart by
// stream and subject names, see Name), else starts an in-process nats-server
// with JetStream storing in a temp dir. Everything is closed when the test
// ends.
func NewNATS(tb testing.TB) *NATS {
	tb.Helper()
	n := testenv.NewNATS(tb)
	return &NATS{URL: n.URL, Conn: n.Conn, JS: n.JS}
}

// Connect dials url, or, when nothing answers there, starts an in-process
// nats-server with JetStream in a temp dir and connects to it, so that a
// program runs on a machine without NATS. stop closes the connection and the
// embedded server (removing its files), if any.
func Connect(url string) (nc *nats.Conn, stop func(), err error) {
	if nc, err = nats.Connect(url, nats.Timeout(2*time.Second)); err == nil {
		return nc, nc.Close, nil
	}
	dir, err := os.MkdirTemp("", "oncekit-nats-")
	if err != nil {
		return nil, nil, err
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	go srv.Start()
	shutdown := func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
	if !srv.ReadyForConnections(10 * time.Second) {
		shutdown()
		return nil, nil, fmt.Errorf("oncekittest: embedded nats-server did not start")
	}
	fmt.Fprintf(os.Stderr, "no NATS at %s: using an embedded server at %s\n", url, srv.ClientURL())
	if nc, err = nats.Connect(srv.ClientURL()); err != nil {
		shutdown()
		return nil, nil, err
	}
	return nc, func() { nc.Close(); shutdown() }, nil
}
