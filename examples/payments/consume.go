package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/sideeffect"
)

func runConsume(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream) error {
	if cfg.Replay != nil {
		return runReplay(ctx, cfg, pool, js, os.Stdout)
	}
	consumer, err := newConsumer(ctx, pool, js, cfg, slog.Default())
	if err != nil {
		return err
	}
	return ignoreCancel(consumer.Run(ctx))
}

// ledgerConsumer is the inbox consumer with the Source it reads.
type ledgerConsumer struct {
	*inbox.Consumer
	src *natsjs.Source
}

// Run runs the consumer until ctx ends, then closes its Source, which hands
// what it still holds back to JetStream at once rather than after AckWait.
func (c *ledgerConsumer) Run(ctx context.Context) error {
	defer c.src.Close()
	return c.Consumer.Run(ctx)
}

// newConsumer reads PaymentCreated events from the durable "ledger". For
// each, in the claim's transaction, it writes a ledger entry and records the
// two side effects; it acks the broker only after that commit. Ordered: an
// account's payments are applied in the order they were created.
func newConsumer(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, cfg *config, log *slog.Logger) (*ledgerConsumer, error) {
	jsSrc, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{
		Stream: stream, Durable: consumerName, FilterSubjects: []string{subject}, AckWait: cfg.AckWait,
	})
	if err != nil {
		return nil, err
	}
	var src broker.OrderedSource = jsSrc
	var early *ackInHandler
	if cfg.Broken == brokenAckBeforeCommit {
		early = &ackInHandler{OrderedSource: src, flush: js.Conn().Flush}
		src = early
	}
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: cfg.Schema})
	if err != nil {
		jsSrc.Close()
		return nil, err
	}
	var apart *claimApart
	if cfg.Broken == brokenClaimApart {
		if apart, err = newClaimApart(pool, cfg.Schema); err != nil {
			jsSrc.Close()
			return nil, err
		}
	}
	h := inbox.JSON(func(ctx context.Context, tx pgx.Tx, m *inbox.Message, ev PaymentCreated) error {
		if apart != nil {
			if first, err := apart.claim(ctx, m); err != nil || !first {
				return err // nil when already claimed: taken for a duplicate
			}
		}
		if early != nil {
			early.ack(ctx, m)
		}
		if cfg.Broken == brokenClaimCommitLocal {
			if err := commitLocal(ctx, tx); err != nil {
				return err
			}
		}
		return applyPayment(ctx, tx, ledger, cfg, m, ev)
	})
	icfg := ledgerConfig(cfg, log)
	icfg.Test = inbox.TestConfig{
		DisableClaim:     apart != nil,                     // the broken build claims on its own
		DisableOrderGate: cfg.Broken == brokenGateBypassed, // order within one process only
	}
	c, err := inbox.NewConsumer(pool, src, h, icfg)
	if err != nil {
		jsSrc.Close()
		return nil, err
	}
	return &ledgerConsumer{Consumer: c, src: jsSrc}, nil
}

// ledgerConfig is the ledger consumer's configuration.
func ledgerConfig(cfg *config, log *slog.Logger) *inbox.Config {
	return &inbox.Config{
		Name: consumerName, Schema: cfg.Schema, Ordered: true, Concurrency: 4, Logger: log,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second,
	}
}

// applyPayment is the handler: every write rides in tx, the claim's
// transaction, so it happens once per payment however often the event
// arrives.
func applyPayment(ctx context.Context, tx pgx.Tx, ledger *sideeffect.Ledger, cfg *config, m *inbox.Message, ev PaymentCreated) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+cfg.table("ledger_entries")+` (payment_id, event_id, account, seq, amount, attempt, applied_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, ev.PaymentID, m.ID, ev.Account, ev.Seq, ev.Amount, m.Attempt, os.Getpid()); err != nil {
		return err
	}
	capture, err := json.Marshal(map[string]any{"payment_id": ev.PaymentID, "amount": ev.Amount, "currency": ev.Currency})
	if err != nil {
		return inbox.Permanent(err)
	}
	receipt, err := json.Marshal(map[string]any{"payment_id": ev.PaymentID, "account": ev.Account, "template": "receipt"})
	if err != nil {
		return inbox.Permanent(err)
	}
	for _, eff := range []sideeffect.Effect{
		{SourceID: ev.PaymentID, Kind: kindCapture, Payload: capture},
		{SourceID: ev.PaymentID, Kind: kindReceipt, Payload: receipt},
	} {
		if _, err := ledger.Record(ctx, tx, eff); err != nil {
			return err
		}
	}
	return nil
}
