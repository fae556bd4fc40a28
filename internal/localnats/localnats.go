// Package localnats connects the examples to NATS: the server at the given
// URL when one answers, else an in-process nats-server with JetStream in a
// temp dir, so that `make demo` runs on a machine without NATS.
package localnats

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Connect dials url, or starts an embedded JetStream server when nothing
// answers there. stop closes the connection and the embedded server, if any.
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
		return nil, nil, err
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		return nil, nil, fmt.Errorf("embedded nats-server did not start")
	}
	fmt.Fprintf(os.Stderr, "no NATS at %s: using an embedded server at %s\n", url, srv.ClientURL())
	if nc, err = nats.Connect(srv.ClientURL()); err != nil {
		srv.Shutdown()
		return nil, nil, err
	}
	return nc, func() {
		nc.Close()
		srv.Shutdown()
		_ = os.RemoveAll(dir)
	}, nil
}
