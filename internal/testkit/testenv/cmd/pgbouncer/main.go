// Command pgbouncer starts Debian's PgBouncer as a daemon in front of the
// test PostgreSQL, in transaction pooling mode with testenv.PgBouncerINI,
// for `make test-pooled`. It prints the URL to run the tests with.
//
//	go run ./internal/testkit/testenv/cmd/pgbouncer -listen 6432
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

func main() {
	listen := flag.Int("listen", 6432, "port to listen on, on 127.0.0.1")
	dir := flag.String("dir", "/tmp/oncekit-pgbouncer", "directory for the configuration, log and pid file")
	flag.Parse()
	if err := run(*listen, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "pgbouncer:", err)
		os.Exit(1)
	}
}

func run(listen int, dir string) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		fmt.Fprintf(os.Stderr, "pgbouncer: something already listens on %s; using it\n", addr)
		return nil
	}
	cfg, err := pgx.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cmd, err := testenv.PgBouncerCommand(dir, cfg.Host, int(cfg.Port), listen, cfg.User, true)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("start: %w (log in %s)", err, dir)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on %s after 10s (log in %s)", addr, dir)
		}
		time.Sleep(50 * time.Millisecond) // polling a port with a deadline
	}
}
