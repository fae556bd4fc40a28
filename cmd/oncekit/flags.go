package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(e *env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("oncekit "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: oncekit %s\n\nflags:\n", usage)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args, turning -h into a clean exit (the flag set has
// printed its usage already) and other errors into usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return &exitError{code: 0}
	}
	if err != nil {
		return usagef("%v", err)
	}
	return nil
}

// dbFlags are the flags of every command that talks to PostgreSQL.
type dbFlags struct {
	url    string
	schema string
}

func (d *dbFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&d.url, "database-url", e.getenv("DATABASE_URL"), "PostgreSQL connection string (env DATABASE_URL)")
	schema := e.getenv("ONCEKIT_SCHEMA")
	if schema == "" {
		schema = pgsql.DefaultSchema
	}
	fs.StringVar(&d.schema, "schema", schema, "schema of oncekit's tables (env ONCEKIT_SCHEMA)")
}

// validate checks the schema name (no SQL through configuration).
func (d *dbFlags) validate() error {
	if _, err := pgsql.ValidateSchema(d.schema); err != nil {
		return usagef("--schema: %v", err)
	}
	return nil
}

// open validates the flags and connects, failing fast with a clear message
// when PostgreSQL cannot be reached.
func (d *dbFlags) open(ctx context.Context) (*pgxpool.Pool, error) {
	if err := d.validate(); err != nil {
		return nil, err
	}
	if d.url == "" {
		return nil, usagef("--database-url (or DATABASE_URL) is required")
	}
	cfg, err := pgxpool.ParseConfig(d.url)
	if err != nil {
		return nil, usagef("--database-url: %v", err)
	}
	// oncekit's statements are short and indexed; JIT compilation only adds
	// hundreds of milliseconds of CPU where a large table's estimates pass
	// jit_above_cost. A jit setting in the URL wins.
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s:%d is unreachable: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// natsFlags are the flags of every command that talks to NATS.
type natsFlags struct{ url string }

func (n *natsFlags) register(fs *flag.FlagSet, e *env) {
	url := e.getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	fs.StringVar(&n.url, "nats-url", url, "NATS server URL (env NATS_URL)")
}

// connect dials NATS once, failing fast when it is unreachable at start, and
// reconnects forever afterwards.
func (n *natsFlags) connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect(n.url,
		nats.Name(name),
		nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectBufSize(-1), // never buffer publishes while disconnected: fail them
	)
	if err != nil {
		return nil, fmt.Errorf("NATS at %s is unreachable: %w", n.url, err)
	}
	return nc, nil
}
