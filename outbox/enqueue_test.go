package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

func newOutbox(t *testing.T, db *testenv.DB, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	cfg.Schema = db.Schema
	ob, err := outbox.New(&cfg)
	require.NoError(t, err)
	return ob
}

func enqueue(t *testing.T, db *testenv.DB, ob *outbox.Outbox, msgs ...broker.Message) outbox.EnqueueResult {
	t.Helper()
	var res outbox.EnqueueResult
	err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = ob.Enqueue(context.Background(), tx, msgs...)
		return err
	})
	require.NoError(t, err)
	return res
}

func countRows(t *testing.T, db *testenv.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

func TestEnqueueWritesInOrderAndReportsDuplicates(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	setPartitions(t, db, 8)
	ob := newOutbox(t, db, outbox.Config{})
	ctx := context.Background()

	a := broker.Message{ID: uuid.New(), Subject: "orders.created", Key: "order-1", Payload: []byte("a"), Headers: map[string]string{"Content-Type": "application/json"}}
	b := broker.Message{ID: uuid.New(), Subject: "orders.paid", Key: "order-1", Payload: []byte("b")}
	c := broker.Message{ID: uuid.New(), Subject: "audit", Payload: nil}
	res := enqueue(t, db, ob, a, b, c)
	require.Equal(t, 3, res.Inserted)
	require.Empty(t, res.Duplicates)

	// Replaying the operation: an existing ID is a no-op, reported; a repeat
	// within one call too.
	d := broker.Message{ID: uuid.New(), Subject: "orders.shipped", Key: "order-1"}
	res = enqueue(t, db, ob, b, d, d)
	require.Equal(t, 1, res.Inserted)
	require.Equal(t, []uuid.UUID{b.ID, d.ID}, res.Duplicates)

	rows, err := db.Pool.Query(ctx, `SELECT id, partition, ordering_key, subject, payload, coalesce(headers->>'Content-Type', '') FROM outbox ORDER BY txid, seq`)
	require.NoError(t, err)
	type row struct {
		id      uuid.UUID
		part    int
		key     string
		subject string
		payload []byte
		ct      string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.part, &x.key, &x.subject, &x.payload, &x.ct)
		return x, err
	})
	require.NoError(t, err)
	require.Len(t, got, 4)
	require.Equal(t, []uuid.UUID{a.ID, b.ID, c.ID, d.ID}, []uuid.UUID{got[0].id, got[1].id, got[2].id, got[3].id})
	require.Equal(t, outbox.PartitionOf(a, 8), got[0].part)
	require.Equal(t, got[0].part, got[1].part, "same key, same partition")
	require.Equal(t, got[0].part, got[3].part)
	require.Equal(t, outbox.PartitionOf(c, 8), got[2].part)
	require.Equal(t, "application/json", got[0].ct)
	require.Equal(t, []byte{}, got[2].payload)
}

func TestEnqueueRolledBackWritesNothing(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ob := newOutbox(t, db, outbox.Config{})
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	res, err := ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: "s"})
	require.NoError(t, err)
	require.Equal(t, 1, res.Inserted)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, countRows(t, db))
}

func TestEnqueueRejectsInvalidMessagesBeforeWriting(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ob := newOutbox(t, db, outbox.Config{MaxPayload: 16})
	ok := broker.Message{ID: uuid.New(), Subject: "ok.subject", Key: "k", Payload: []byte("fine")}
	cases := []struct {
		name string
		msg  broker.Message
		want error
	}{
		{"nil id", broker.Message{Subject: "s"}, outbox.ErrNilID},
		{"empty subject", broker.Message{ID: uuid.New()}, outbox.ErrInvalidSubject},
		{"empty token", broker.Message{ID: uuid.New(), Subject: "a..b"}, outbox.ErrInvalidSubject},
		{"trailing dot", broker.Message{ID: uuid.New(), Subject: "a."}, outbox.ErrInvalidSubject},
		{"wildcard", broker.Message{ID: uuid.New(), Subject: "a.*"}, outbox.ErrInvalidSubject},
		{"full wildcard", broker.Message{ID: uuid.New(), Subject: "a.>"}, outbox.ErrInvalidSubject},
		{"space", broker.Message{ID: uuid.New(), Subject: "a b"}, outbox.ErrInvalidSubject},
		{"too long subject", broker.Message{ID: uuid.New(), Subject: strings.Repeat("a", 256)}, outbox.ErrInvalidSubject},
		{"payload too large", broker.Message{ID: uuid.New(), Subject: "s", Payload: make([]byte, 17)}, outbox.ErrPayloadTooLarge},
		{"empty header name", broker.Message{ID: uuid.New(), Subject: "s", Headers: map[string]string{"": "v"}}, outbox.ErrInvalidHeader},
		{"header name with colon", broker.Message{ID: uuid.New(), Subject: "s", Headers: map[string]string{"A:B": "v"}}, outbox.ErrInvalidHeader},
		{"header name with space", broker.Message{ID: uuid.New(), Subject: "s", Headers: map[string]string{"A B": "v"}}, outbox.ErrInvalidHeader},
		{"reserved header", broker.Message{ID: uuid.New(), Subject: "s", Headers: map[string]string{"nats-msg-id": "x"}}, outbox.ErrInvalidHeader},
		{"header value newline", broker.Message{ID: uuid.New(), Subject: "s", Headers: map[string]string{"X": "a\r\nB: c"}}, outbox.ErrInvalidHeader},
		{"key newline", broker.Message{ID: uuid.New(), Subject: "s", Key: "a\nb"}, outbox.ErrInvalidKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
				_, err := ob.Enqueue(context.Background(), tx, ok, tc.msg)
				require.Error(t, err)
				return nil // commit: proves nothing was written, not a rollback
			})
			require.NoError(t, err)
			_, err = ob.Enqueue(context.Background(), nil, tc.msg)
			require.Error(t, err)
			err = func() error {
				tx, err := db.Pool.Begin(context.Background())
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(context.Background()) }()
				_, err = ob.Enqueue(context.Background(), tx, ok, tc.msg)
				return err
			}()
			require.ErrorIs(t, err, tc.want)
			var ime *outbox.InvalidMessageError
			require.True(t, errors.As(err, &ime))
			require.Equal(t, 1, ime.Index)
			require.Equal(t, tc.msg.ID, ime.ID)
		})
	}
	require.Zero(t, countRows(t, db))
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	_, err := outbox.New(&outbox.Config{Schema: "x; DROP TABLE y"})
	require.ErrorContains(t, err, "Config.Schema")
	_, err = outbox.New(&outbox.Config{MaxPayload: -1})
	require.ErrorContains(t, err, "Config.MaxPayload")
	_, err = outbox.New(nil)
	require.NoError(t, err)
}
