package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/outbox"
)

func init() {
	register(&command{name: "relay", summary: "run the outbox relay daemon (outbox → JetStream)", run: runRelay})
}

func runRelay(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "relay", "relay [flags]")
	var db dbFlags
	var nf natsFlags
	db.register(fs, e)
	nf.register(fs, e)
	var (
		cfg       outbox.RelayConfig
		listen    = fs.String("listen", e.getenv("ONCEKIT_LISTEN"), "address serving /healthz and /metrics, e.g. :9090 (env ONCEKIT_LISTEN; empty: off)")
		stream    = fs.String("stream", "", "create or update this JetStream stream at start (with --subjects); by default the stream must exist")
		subjects  = fs.String("subjects", "", "comma-separated subjects of --stream")
		dupWindow = fs.Duration("duplicates", natsjs.DefaultDuplicates, "dedup window of --stream: a re-publish within it is absorbed by JetStream")
		logFormat = fs.String("log-format", "text", "log format: text or json")
		logLevel  = fs.String("log-level", "info", "log level: debug, info, warn or error")
	)
	fs.IntVar(&cfg.Partitions, "partitions", envInt(e, "ONCEKIT_PARTITIONS", outbox.DefaultPartitions), "number of partitions; must equal the writers' outbox.Config.Partitions (env ONCEKIT_PARTITIONS)")
	fs.StringVar(&cfg.NodeID, "node-id", "", "name of this relay in the lease tables (default hostname-pid-random)")
	fs.IntVar(&cfg.BatchSize, "batch", 1000, "most rows read and published at once per partition")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 10*time.Second, "partition lease duration (renewed every third of it)")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", 500*time.Millisecond, "longest wait between two looks at the outbox")
	fs.DurationVar(&cfg.BusyPollInterval, "busy-poll-interval", time.Millisecond, "wait between looks while events keep arriving")
	fs.BoolVar(&cfg.PollOnly, "poll-only", false, "do not LISTEN (PgBouncer transaction pooling)")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 10, "failed publishes before a message is parked")
	fs.DurationVar(&cfg.Retention, "retention", 24*time.Hour, "keep published rows this long after their enqueue (negative: never delete)")
	fs.DurationVar(&cfg.PublishTimeout, "publish-timeout", 30*time.Second, "bound on one publish round")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	log, err := newLogger(e, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	cfg.Schema = db.schema
	cfg.Logger = log
	reg := newRegistry()
	cfg.Registerer = reg
	if *stream != "" && *subjects == "" {
		return usagef("--stream needs --subjects")
	}
	if cfg.Partitions < 1 {
		return usagef("--partitions: %d must be positive", cfg.Partitions)
	}

	// Enough connections for every partition's worker plus the loops.
	if db.url != "" && !strings.Contains(db.url, "pool_max_conns") {
		sep := "?"
		if strings.Contains(db.url, "?") {
			sep = "&"
		}
		db.url += fmt.Sprintf("%spool_max_conns=%d", sep, min(cfg.Partitions, 64)+4)
	}
	pool, err := db.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkTables(ctx, pool, db.schema); err != nil {
		return err
	}
	nc, err := nf.connect("oncekit relay")
	if err != nil {
		return err
	}
	defer nc.Close()
	if *stream != "" {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = natsjs.EnsureStream(sctx, js, natsjs.StreamConfig{Name: *stream, Subjects: strings.Split(*subjects, ","), Duplicates: *dupWindow})
		cancel()
		if err != nil {
			return err
		}
	}
	pub, err := natsjs.NewPublisher(nc, nil)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, pub, &cfg)
	if err != nil {
		return usagef("%v", err)
	}
	healthy := func(ctx context.Context) error {
		if !nc.IsConnected() {
			return errors.New("NATS disconnected")
		}
		return pool.Ping(ctx)
	}
	if err := serveOps(ctx, log, *listen, reg, healthy); err != nil {
		return err
	}
	if err := relay.Run(ctx); err != nil {
		return err
	}
	return nil
}

// checkTables fails with a clear message when the migrations were not run.
func checkTables(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	var ok bool
	err := pool.QueryRow(ctx, `SELECT to_regclass(format('%I.outbox', $1::text)) IS NOT NULL
		AND to_regclass(format('%I.relay_partitions', $1::text)) IS NOT NULL`, schema).Scan(&ok)
	if err != nil {
		return fmt.Errorf("check tables: %w", err)
	}
	if !ok {
		return fmt.Errorf("schema %q has no outbox tables: run `oncekit migrate up --schema %s` first", schema, schema)
	}
	return nil
}

func newLogger(e *env, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level: %v", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	default:
		return nil, usagef("--log-format: %q: want text or json", format)
	}
}

func envInt(e *env, name string, def int) int {
	var n int
	if v := e.getenv(name); v != "" {
		if _, err := fmt.Sscan(v, &n); err == nil {
			return n
		}
	}
	return def
}
