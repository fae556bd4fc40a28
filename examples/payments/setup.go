package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
)

// The service's own tables. A payment's ID is DeriveID(tenant, key), so a
// retried request can only ever find its own row. Ledger entries carry no
// unique constraint on payment_id on purpose: exactly one entry per payment
// is the inbox's promise, and a checker can only see it broken if the
// schema does not hide it. accounts.seq numbers each account's payments in
// commit order, so that the ledger can be checked for per-account order.
// A payment's reference (the client's own, such as an invoice number) is
// unique per account: the backstop behind the edge's business key, for a
// client that sends one payment under two Idempotency-Keys.
const serviceSchema = `
CREATE TABLE IF NOT EXISTS %[1]s.accounts (
	id  text PRIMARY KEY,
	seq bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS %[1]s.payments (
	id         uuid PRIMARY KEY,
	account    text NOT NULL,
	seq        bigint NOT NULL,
	amount     bigint NOT NULL,
	currency   text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS %[1]s.ledger_entries (
	id         bigserial PRIMARY KEY,
	payment_id uuid NOT NULL,
	event_id   uuid NOT NULL,
	account    text NOT NULL,
	seq        bigint NOT NULL,
	amount     bigint NOT NULL,
	attempt    int NOT NULL,
	applied_by int NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS ledger_entries_payment_id ON %[1]s.ledger_entries (payment_id);
ALTER TABLE %[1]s.payments ADD COLUMN IF NOT EXISTS reference text;
CREATE UNIQUE INDEX IF NOT EXISTS payments_account_reference ON %[1]s.payments (account, reference);`

func runSetup(ctx context.Context, cfg *config, pool *pgxpool.Pool, js jetstream.JetStream) error {
	if err := setupTables(ctx, pool, cfg); err != nil {
		return err
	}
	return setupStream(ctx, js, cfg.Replicas)
}

// setupTables applies oncekit's migrations and the service's tables in the
// schema.
func setupTables(ctx context.Context, pool *pgxpool.Pool, cfg *config) error {
	if _, err := migrations.Up(ctx, pool, migrations.WithSchema(cfg.Schema)); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(serviceSchema, `"`+cfg.Schema+`"`)); err != nil {
		return fmt.Errorf("service tables: %w", err)
	}
	if cfg.Logical { // the slot, before the first event
		ob, err := outbox.New(&outbox.Config{Schema: cfg.Schema, Logical: true})
		if err != nil {
			return err
		}
		return ob.SetUpLogical(ctx, pool)
	}
	return nil
}

// setupStream creates the stream, retrying while a cluster elects its
// leaders.
func setupStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = natsjs.EnsureStream(attempt, js, natsjs.StreamConfig{Name: stream, Subjects: []string{"payments.>"}, Replicas: replicas})
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	return nil
}
