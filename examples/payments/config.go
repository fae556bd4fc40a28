package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
)

// Names the roles agree on.
const (
	stream        = "PAYMENTS"
	subject       = "payments.created"
	consumerName  = "ledger"
	operation     = "create-payment"
	kindCapture   = "provider.capture"
	kindReceipt   = "receipt.email"
	defaultDB     = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultNATS   = "nats://127.0.0.1:4222"
	defaultSchema = "payments"
)

// config is what every role is started with. Defaults come from the
// environment; flags override them. Help never prints the environment's
// values (a DATABASE_URL may hold a password).
type config struct {
	DatabaseURL string
	NATSURL     string
	Schema      string
	Listen      string
	ProviderURL string
	Replicas    int
	AckWait     time.Duration
	Lease       time.Duration
	FailRate    float64
	LoseRate    float64
	// Broken names a guarantee to break on purpose, so that a checker can be
	// shown to catch it. Only tests set it (PAYMENTS_BROKEN).
	Broken string
	// Logical writes events into the WAL and runs the logical relay
	// (PAYMENTS_LOGICAL=1; wal_level = logical).
	Logical bool
	// Replay, when set, makes consume replay this window of the stream
	// through its handler and exit (-replay-from, -replay-to).
	Replay *natsjs.WindowConfig
	// ReplicationURL is the logical relay's stream and lease, which need
	// the server itself when DatabaseURL goes through a pooler
	// (PAYMENTS_REPLICATION_URL; default DatabaseURL).
	ReplicationURL string
}

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func parseConfig(role string, args []string, stderr io.Writer) (*config, []string, error) {
	cfg := &config{
		DatabaseURL: getenv("DATABASE_URL", defaultDB),
		NATSURL:     getenv("NATS_URL", defaultNATS),
		Schema:      getenv("PAYMENTS_SCHEMA", defaultSchema),
		ProviderURL: getenv("PROVIDER_URL", "http://127.0.0.1:8090"),
		Broken:      os.Getenv("PAYMENTS_BROKEN"),
		Logical:     os.Getenv("PAYMENTS_LOGICAL") == "1",
		// Read after the flags: its default is the database URL.
		ReplicationURL: os.Getenv("PAYMENTS_REPLICATION_URL"),
	}
	var replay windowFlags
	fs := flag.NewFlagSet("payments "+role, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Func("db", "PostgreSQL URL (default: $DATABASE_URL, else the local server)", setString(&cfg.DatabaseURL))
	fs.Func("nats", "NATS server URLs, comma-separated (default: $NATS_URL, else "+defaultNATS+")", setString(&cfg.NATSURL))
	fs.StringVar(&cfg.Schema, "schema", cfg.Schema, "schema of the service's and oncekit's tables ($PAYMENTS_SCHEMA)")
	switch role {
	case "api":
		fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "address to serve POST /payments on")
	case "provider":
		fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8090", "address to serve the provider on")
		fs.Float64Var(&cfg.FailRate, "fail-rate", 0, "share of calls answered 503 without acting")
		fs.Float64Var(&cfg.LoseRate, "lose-rate", 0, "share of first calls that act and then lose their response")
	case "dispatch":
		fs.StringVar(&cfg.ProviderURL, "provider", cfg.ProviderURL, "provider base URL ($PROVIDER_URL)")
		fs.DurationVar(&cfg.Lease, "lease", 6*time.Second, "how long a fired effect belongs to this dispatcher")
	case "relay":
		fs.DurationVar(&cfg.Lease, "lease", 5*time.Second, "partition lease TTL")
	case "consume":
		fs.DurationVar(&cfg.AckWait, "ack-wait", 5*time.Second, "JetStream AckWait of the durable")
		fs.StringVar(&replay.from, "replay-from", "", "replay the stream from here through the handler and exit, printing one line of counts:\n"+
			"a stream sequence, an RFC 3339 time, or a duration before now (15m); after an asynchronous failover of PostgreSQL")
		fs.StringVar(&replay.to, "replay-to", "", "end of the replayed window, as -replay-from (default: the stream's last message)")
	case "setup":
		fs.IntVar(&cfg.Replicas, "replicas", 1, "stream replicas (3 on a three-node cluster)")
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	var err error
	if cfg.Replay, err = replay.window(time.Now()); err != nil {
		return nil, nil, err
	}
	if !schemaName.MatchString(cfg.Schema) {
		return nil, nil, fmt.Errorf("-schema %q: want a lower-case SQL identifier", cfg.Schema)
	}
	if cfg.FailRate < 0 || cfg.FailRate > 1 || cfg.LoseRate < 0 || cfg.LoseRate > 1 {
		return nil, nil, fmt.Errorf("-fail-rate and -lose-rate are shares between 0 and 1")
	}
	return cfg, fs.Args(), nil
}

func setString(p *string) func(string) error {
	return func(v string) error { *p = v; return nil }
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// table qualifies a table of the service's schema.
func (c *config) table(name string) string { return `"` + c.Schema + `".` + name }

// openPool connects to PostgreSQL. The pool reconnects by itself after a
// restart or a dropped connection.
func (c *config) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = 12
	pc.ConnConfig.ConnectTimeout = 3 * time.Second
	return pgxpool.NewWithConfig(ctx, pc)
}

// connectNATS dials the servers and keeps reconnecting for as long as the
// process lives: a cluster node going away is routine.
func (c *config) connectNATS() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(strings.ReplaceAll(c.NATSURL, " ", ""),
		nats.Name("payments"), nats.Timeout(3*time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 0),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		return nil, nil, fmt.Errorf("NATS: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
