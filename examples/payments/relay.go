package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/outbox"
)

func runRelay(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream) error {
	relay, err := newRelay(ctx, pool, js, cfg, slog.Default())
	if err != nil {
		return err
	}
	return ignoreCancel(relay.Run(ctx))
}

// newRelay publishes the outbox with Nats-Msg-Id = event ID. Several relay
// processes share the partitions through leases; a dead one's partitions
// move to the others when its lease expires. With cfg.Logical it follows
// the WAL: one relay streams, the others stand by.
func newRelay(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, cfg *config, log *slog.Logger) (interface{ Run(context.Context) error }, error) {
	var pub broker.Publisher
	pub, err := natsjs.NewPublisher(js.Conn(), nil)
	if err != nil {
		return nil, err
	}
	if cfg.Broken == brokenMarkBeforeAck {
		late := &publishLate{pub: pub}
		go late.run(ctx, 100*time.Millisecond)
		pub = late
	}
	ob, err := outbox.New(&outbox.Config{Schema: cfg.Schema, Logical: cfg.Logical})
	if err != nil {
		return nil, err
	}
	table := outbox.RelayConfig{
		Lease:          cfg.Lease,
		PollInterval:   100 * time.Millisecond,
		PublishTimeout: 5 * time.Second,
		MinBackoff:     200 * time.Millisecond,
		MaxBackoff:     2 * time.Second,
		Logger:         log,
	}
	if cfg.Logical {
		return outbox.NewLogicalRelay(pool, ob, pub, &outbox.LogicalRelayConfig{ReplicationURL: cfg.ReplicationURL,
			PublishTimeout: 5 * time.Second, StatusInterval: time.Second, Table: table, Logger: log,
		})
	}
	return outbox.NewRelay(pool, ob, pub, &table)
}
