package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/eventsig"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
)

// relayFlags names the flags of the RelayConfig fields.
var relayFlags = configFlags{"BatchSize": "--batch", "Lease": "--lease",
	"PollInterval": "--poll-interval", "BusyPollInterval": "--busy-poll-interval", "PublishTimeout": "--publish-timeout",
	"MaxAttempts": "--max-attempts", "Retention": "--retention", "ID": "--id", "Schema": "--schema"}

func runRelay(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "relay", "relay [flags]")
	var db dbFlags
	var nf natsFlags
	db.register(fs, e)
	nf.register(fs, e)
	var listenFlag, replURLFlag, standbyURLFlag envString
	var (
		cfg       outbox.RelayConfig
		stream    = fs.String("stream", "", "create or update this JetStream stream at start (with --subjects); by default the stream must exist")
		subjects  = fs.String("subjects", "", "comma-separated subjects of --stream")
		dupWindow = fs.Duration("duplicates", natsjs.DefaultDuplicates, "dedup window of --stream: a re-publish within it is absorbed by JetStream")
		logFormat = fs.String("log-format", "text", "log format: text or json")
		logLevel  = fs.String("log-level", "info", "log level: debug, info, warn or error")
		signKey   = fs.String("signing-key", "", "`FILE` holding the base64 Ed25519 private key (or 32-byte seed) that signs every event (eventsig); off by default")
		signKeyID = fs.String("signing-key-id", "", "`ID` naming --signing-key in each signature, so consumers can hold several keys during a rotation")
		logical   = fs.Bool("logical", false, "follow the WAL through a replication slot (producers enqueue with outbox.Config.Logical; wal_level=logical) instead of polling the outbox table; the table's relay runs too, for parked and older rows")
		slot      = fs.String("slot", "", "`NAME` of the replication slot and publication of --logical (default oncekit_ and the schema)")
	)
	fs.Var(&replURLFlag, "replication-url", "PostgreSQL `URL` of --logical's replication stream and lease, which need a direct connection to the server, not a pooler's (default: env ONCEKIT_REPLICATION_URL, else the database URL); the rest may go through a pooler")
	fs.Var(&standbyURLFlag, "standby-url", "PostgreSQL `URL` of a standby a failover may promote (PostgreSQL 17, sync_replication_slots): --logical reads its copy of the slot into oncekit_outbox_logical_standby_slot_ready (default: env ONCEKIT_STANDBY_URL, else none and no such gauge)")
	var ff fleetFlags
	ff.register(fs)
	fs.Var(&listenFlag, "listen", "`ADDR` serving /healthz and /metrics, e.g. 127.0.0.1:9090 (default: env ONCEKIT_LISTEN, else off)")
	fs.StringVar(&cfg.ID, "id", "", "name of this relay in the lease tables (default hostname-pid-random)")
	fs.IntVar(&cfg.BatchSize, "batch", 1000, "most rows read and published at once per partition")
	fs.DurationVar(&cfg.Lease, "lease", 10*time.Second, "partition lease duration (renewed every third of it)")
	fs.DurationVar(&cfg.PollInterval, "poll-interval", 500*time.Millisecond, "longest wait between two looks at the outbox (with --logical: at the table, 5s unless set)")
	fs.DurationVar(&cfg.BusyPollInterval, "busy-poll-interval", time.Millisecond, "wait between looks while events keep arriving")
	fs.BoolVar(&cfg.PollOnly, "poll-only", false, "do not LISTEN, even on a direct connection (through a pooler the relay finds it and polls by itself)")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 10, "failed publishes before a message is parked")
	fs.DurationVar(&cfg.Retention, "retention", 24*time.Hour, "keep published rows this long after their enqueue (negative: never delete)")
	fs.IntVar(&cfg.RetentionRate, "retention-rate", oncekit.DefaultRetentionRate, "most rows retention deletes per second (negative: no limit)")
	fs.DurationVar(&cfg.PublishTimeout, "publish-timeout", 30*time.Second, "bound on one publish round and on one publish's wait for its ack")
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
	cfg.Logger = log
	reg := newRegistry()
	cfg.Registerer = reg
	if *stream != "" && *subjects == "" {
		return usagef("--stream needs --subjects")
	}
	listen := listenFlag.resolve(e, "ONCEKIT_LISTEN", "")

	if err := nonNegative(fs, "lease", "poll-interval", "busy-poll-interval", "publish-timeout"); err != nil {
		return err
	}
	if replURLFlag.set && !*logical {
		return usagef("--replication-url needs --logical")
	}
	// The stream and the lease need the server itself; the pool may go
	// through a pooler.
	replURL := replURLFlag.resolve(e, "ONCEKIT_REPLICATION_URL", "")
	if err := checkURL(replURL); replURL != "" && err != nil {
		return usagef("--replication-url: %v", err)
	}
	standbyURL := standbyURLFlag.resolve(e, "ONCEKIT_STANDBY_URL", "")
	if standbyURL != "" && !*logical {
		return usagef("--standby-url needs --logical")
	}
	if err := checkURL(standbyURL); standbyURL != "" && err != nil {
		return usagef("--standby-url: %v", err)
	}
	if err := ff.check(fs); err != nil {
		return err
	}
	var pool *pgxpool.Pool
	if ff.file == "" { // a fleet opens a pool per database it serves
		// Enough connections for a worker per partition (up to 64) plus the
		// loops; the pool opens them only as they are needed.
		db.maxConns = 64 + 4
		component := migrations.Relay
		if *logical {
			component = migrations.LogicalRelay
		}
		if pool, err = db.openFor(ctx, component); err != nil {
			return err
		}
		defer pool.Close()
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
	// A publish the relay gave up on frees its place in the window then,
	// not only after the publisher's own default.
	np, err := natsjs.NewPublisher(nc, &natsjs.PublisherConfig{AckTimeout: cfg.PublishTimeout})
	if err != nil {
		return err
	}
	var pub broker.Publisher = np
	if *signKey != "" || *signKeyID != "" {
		signer, err := readSigner(*signKey, *signKeyID)
		if err != nil {
			return usagef("--signing-key: %v", err)
		}
		pub = eventsig.SignPublisher(np, signer)
	}
	if *slot != "" && !*logical {
		return usagef("--slot needs --logical")
	}
	if ff.file != "" {
		return ff.run(ctx, log, reg, listen, nc, pub, cfg)
	}
	ob, err := outbox.New(&outbox.Config{Schema: db.schema(), Logical: *logical, Slot: *slot})
	if err != nil {
		return relayFlags.usage(err)
	}
	var relay interface{ Run(context.Context) error }
	if *logical {
		if !flagSet(fs, "poll-interval") {
			cfg.PollInterval = 0 // the logical relay's default for its table
		}
		lcfg := &outbox.LogicalRelayConfig{PublishTimeout: cfg.PublishTimeout, BatchSize: cfg.BatchSize, Table: cfg, Logger: log,
			Registerer: reg, ReplicationURL: replURL}
		if standbyURL != "" {
			standby, err := openStandby(standbyURL)
			if err != nil {
				return usagef("--standby-url: %v", err)
			}
			defer standby.Close()
			lcfg.Standby = standby
		}
		relay, err = outbox.NewLogicalRelay(pool, ob, pub, lcfg)
	} else {
		relay, err = outbox.NewRelay(pool, ob, pub, &cfg)
	}
	if err != nil {
		return relayFlags.usage(err)
	}
	healthy := func(ctx context.Context) error {
		if !nc.IsConnected() {
			return errors.New("NATS disconnected")
		}
		// A statement of the relay's loops that PostgreSQL refuses as sent.
		if h, ok := relay.(interface{ Healthy(context.Context) error }); ok {
			if err := h.Healthy(ctx); err != nil {
				return err
			}
		}
		return pool.Ping(ctx)
	}
	if err := serveOps(ctx, log, listen, reg, healthy); err != nil {
		return err
	}
	if err := relay.Run(ctx); err != nil {
		return err // a *PooledError names --replication-url
	}
	return nil
}

func newLogger(e *env, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level: %v", err)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: redactAttr}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	default:
		return nil, usagef("--log-format: %q: want text or json", format)
	}
}

// readSigner reads the Ed25519 key in file (base64: a 64-byte private key
// or its 32-byte seed) for a Signer named keyID. The key never reaches an
// error message.
func readSigner(file, keyID string) (*eventsig.Signer, error) {
	if file == "" || keyID == "" {
		return nil, errors.New("give both --signing-key and --signing-key-id")
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("%s does not hold base64", file)
	}
	switch len(key) {
	case ed25519.SeedSize:
		key = ed25519.NewKeyFromSeed(key)
	case ed25519.PrivateKeySize:
	default:
		return nil, fmt.Errorf("%s holds %d bytes; want an Ed25519 seed (32) or private key (64)", file, len(key))
	}
	return eventsig.NewSigner(keyID, ed25519.PrivateKey(key))
}

// openStandby opens a pool of at most two connections to a standby, for
// the logical relay's read of its copy of the slot. It connects lazily: a
// standby down is a gauge at 0, not a relay that cannot start.
func openStandby(url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 2
	return pgxpool.NewWithConfig(context.Background(), cfg)
}
