package idempotency_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// paymentEvents returns the SameTx handler's event writer: it enqueues a
// PaymentCreated event in the outbox, in the claim's transaction, with an ID
// derived from the payment ID, so a re-execution enqueues the same event (a
// no-op the outbox reports as a duplicate).
func paymentEvents(schema string) (func(ctx context.Context, tx pgx.Tx, paymentID uuid.UUID) error, error) {
	ob, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, tx pgx.Tx, paymentID uuid.UUID) error {
		_, err := ob.Enqueue(ctx, tx, broker.Message{
			ID:      oncekit.DeriveID(paymentID.String(), "PaymentCreated"),
			Subject: "payments.created",
			Key:     paymentID.String(),
			Payload: []byte(`{"id":"` + paymentID.String() + `"}`),
		})
		return err
	}, nil
}

func sameTxRoute() *idempotency.Route {
	return &idempotency.Route{Operation: "create-payment", Mode: idempotency.SameTx, Tenant: tenantFromHeader}
}

// Case 11: in SameTx mode the handler writes a row and an outbox event
// (outbox.Enqueue) in the claim's transaction. A SIGKILL of the server process
// before the commit leaves neither (nor a claim); the retry executes and
// writes both once; replays never emit a second event, and even a
// re-execution (after the record expired) finds its event already there.
func TestSameTxOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, paymentsDDL)
	require.NoError(t, err)

	cmd, url := startHelper(t, db, idempotency.SameTx, "idempotency.before-commit")
	postAndDie(t, cmd, url)
	require.Zero(t, count(t, db, `SELECT count(*) FROM payments`))
	require.Zero(t, count(t, db, `SELECT count(*) FROM outbox`))
	require.Zero(t, count(t, db, `SELECT count(*) FROM idempotency_keys`))

	h := newHarnessOn(t, db, *sameTxRoute(), nil)
	h.event, err = paymentEvents(db.Schema)
	require.NoError(t, err)
	var first response
	require.Eventually(t, func() bool { // the dead backend's lock goes as soon as PostgreSQL sees the socket close
		first = h.post(t, "acme", "pay-1", `{"amount":100}`)
		return first.status != http.StatusConflict
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Empty(t, first.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM payments`))
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM outbox`))

	for range 3 {
		again := h.post(t, "acme", "pay-1", `{"amount":100}`)
		require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
		require.Equal(t, first.body, again.body)
	}
	require.EqualValues(t, 1, h.runs.Load())
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM outbox`))

	// Past its TTL the key executes again; the derived event ID makes the
	// second write a no-op.
	_, err = db.Pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
	require.EqualValues(t, 2, h.runs.Load())
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM payments`))
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM outbox`))
}
