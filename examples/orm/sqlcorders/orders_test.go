package sqlcorders_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/examples/orm/ormtest"
	"github.com/oncekit/oncekit/examples/orm/sqlcorders"
	"github.com/oncekit/oncekit/sideeffect"
)

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			w := ormtest.New(t)
			ctx := context.Background()
			led, err := sideeffect.New(&sideeffect.Config{Schema: w.Schema})
			require.NoError(t, err)
			svc := &sqlcorders.Service{DB: w.DB, Outbox: w.Outbox, Ledger: led, Subject: w.Subject}
			id := uuid.New()
			stx, err := w.DB.BeginTx(ctx, nil)
			require.NoError(t, err)
			order, err := svc.PlaceOrder(ctx, stx, sqlcorders.CreateOrderParams{ID: id, Customer: "ana", Amount: 4200})
			require.NoError(t, err)
			require.Equal(t, int64(4200), order.Amount)
			// Read back through sqlc in the same transaction.
			got, err := sqlcorders.New(w.DB).WithTx(stx).GetOrder(ctx, id)
			require.NoError(t, err)
			require.Equal(t, order, got)
			if commit {
				require.NoError(t, stx.Commit())
				require.Equal(t, 1, w.Count(`SELECT count(*) FROM side_effects WHERE source_id = $1`, id.String()))
				w.RequireCommitted(id, oncekit.DeriveID(id.String(), "OrderPlaced"))
			} else {
				require.NoError(t, stx.Rollback())
				require.Equal(t, 0, w.Count(`SELECT count(*) FROM side_effects WHERE source_id = $1`, id.String()))
				w.RequireRolledBack(id, oncekit.DeriveID(id.String(), "OrderPlaced"))
			}
		})
	}
}

// A transaction already ended is refused with sql.ErrTxDone, before any
// write.
func TestPlaceOrderEndedTx(t *testing.T) {
	t.Parallel()
	w := ormtest.New(t)
	ctx := context.Background()
	stx, err := w.DB.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, stx.Rollback())
	_, err = oncekit.FromSQLTx(ctx, stx)
	require.True(t, errors.Is(err, sql.ErrTxDone), "%v", err)
}
