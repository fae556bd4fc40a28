package oncekittest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/tracecontext"
)

// Handle runs a handler as the consumer does: once per message ID, its
// writes with the claim, nothing of a failed attempt kept.
func TestHandleRunsAHandlerOncePerMessage(t *testing.T) {
	ctx := context.Background()
	db := oncekittest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE receipts (message_id uuid PRIMARY KEY, traceparent text)`)
	require.NoError(t, err)
	fail := errors.New("provider down")
	failing := true
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		tc, _ := tracecontext.FromContext(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO receipts VALUES ($1, $2)`, m.ID, tc.Traceparent); err != nil {
			return err
		}
		require.ErrorIs(t, tx.Commit(ctx), inbox.ErrTxOwned)
		if failing {
			return fail
		}
		return nil
	})
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msg := broker.Message{ID: uuid.New(), Subject: "orders.paid", Headers: map[string]string{tracecontext.HeaderTraceparent: tp}}
	count := func() (n int) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM receipts WHERE traceparent = $1`, tp).Scan(&n))
		return n
	}

	out, err := oncekittest.Handle(ctx, t, db, "receipts", h, msg)
	require.ErrorIs(t, err, fail)
	require.Equal(t, oncekittest.RolledBack, out)
	require.Zero(t, count(), "a failed attempt keeps nothing, the claim neither")

	failing = false
	out, err = oncekittest.Handle(ctx, t, db, "receipts", h, msg)
	require.NoError(t, err)
	require.Equal(t, oncekittest.Processed, out)
	out, err = oncekittest.Handle(ctx, t, db, "receipts", h, msg)
	require.NoError(t, err)
	require.Equal(t, oncekittest.Duplicate, out)
	require.Equal(t, 1, count())
}
