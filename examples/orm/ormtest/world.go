// Package ormtest gives each example's test a schema of its own on the
// local PostgreSQL (DATABASE_URL) with oncekit's tables and an orders
// table, and checks that the outbox relay publishes an event to NATS
// JetStream (NATS_URL).
package ormtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
)

// OrdersDDL is the business table every example writes.
const OrdersDDL = `CREATE TABLE orders (
	id       uuid   PRIMARY KEY,
	customer text   NOT NULL,
	amount   bigint NOT NULL)`

// World is one test's schema, reached through pgx and database/sql.
type World struct {
	T      *testing.T
	Schema string
	Pool   *pgxpool.Pool // search_path set to Schema
	DB     *sql.DB       // pgx's stdlib over Pool
	Outbox *outbox.Outbox
	// Subject is the subject the test's events go to: "<Schema>.orders",
	// taken by the stream RequireCommitted makes.
	Subject string
}

// New makes a fresh schema with oncekit's migrations and the orders table;
// it is dropped when the test ends.
func New(t *testing.T) *World {
	t.Helper()
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "orm_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, pool, migrations.WithSchema(schema))
	require.NoError(t, err, "migrations (is PostgreSQL up at %s?)", url)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() {
		_ = db.Close()
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
		pool.Close()
	})
	_, err = pool.Exec(ctx, OrdersDDL)
	require.NoError(t, err)
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	require.NoError(t, err)
	return &World{T: t, Schema: schema, Pool: pool, DB: db, Outbox: ob, Subject: schema + ".orders"}
}

// Count runs a count(*) query.
func (w *World) Count(query string, args ...any) int {
	w.T.Helper()
	var n int
	require.NoError(w.T, w.Pool.QueryRow(context.Background(), query, args...).Scan(&n))
	return n
}

// RequireCommitted checks that the order and its event both exist, and
// that the outbox relay publishes the event to a stream of the test's own.
func (w *World) RequireCommitted(orderID, eventID uuid.UUID) {
	w.T.Helper()
	require.Equal(w.T, 1, w.Count(`SELECT count(*) FROM orders WHERE id = $1`, orderID))
	require.Equal(w.T, 1, w.Count(`SELECT count(*) FROM outbox WHERE id = $1`, eventID))
	w.requireRelayed(eventID)
}

// RequireRolledBack checks that neither the order nor its event exists.
func (w *World) RequireRolledBack(orderID, eventID uuid.UUID) {
	w.T.Helper()
	require.Equal(w.T, 0, w.Count(`SELECT count(*) FROM orders WHERE id = $1`, orderID))
	require.Equal(w.T, 0, w.Count(`SELECT count(*) FROM outbox WHERE id = $1`, eventID))
}

// NATS connects to NATS_URL (default the local server).
func (w *World) NATS() (*nats.Conn, jetstream.JetStream) {
	w.T.Helper()
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url)
	require.NoError(w.T, err)
	w.T.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(w.T, err)
	return nc, js
}

// Stream makes a stream of the test's own, deleted at its end, that takes
// Subject.
func (w *World) Stream(js jetstream.JetStream) string {
	w.T.Helper()
	name := w.Schema
	_, err := natsjs.EnsureStream(context.Background(), js, natsjs.StreamConfig{Name: name, Subjects: []string{w.Subject}})
	require.NoError(w.T, err)
	w.T.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return name
}

// requireRelayed runs the outbox relay until eventID is published, then
// finds it in the stream.
func (w *World) requireRelayed(eventID uuid.UUID) {
	w.T.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, js := w.NATS()
	stream := w.Stream(js)
	pub, err := natsjs.NewPublisher(nc, nil)
	require.NoError(w.T, err)
	relay, err := outbox.NewRelay(w.Pool, w.Outbox, pub, &outbox.RelayConfig{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(w.T, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(w.T, func() bool {
		evs, err := w.Outbox.Events(ctx, w.Pool, []uuid.UUID{eventID}, 1)
		return err == nil && len(evs) == 1 && evs[0].Published
	}, 30*time.Second, 10*time.Millisecond)
	st, err := js.Stream(ctx, stream)
	require.NoError(w.T, err)
	msg, err := st.GetLastMsgForSubject(ctx, w.Subject)
	require.NoError(w.T, err)
	require.Equal(w.T, eventID.String(), msg.Header.Get(jetstream.MsgIDHeader))
}
