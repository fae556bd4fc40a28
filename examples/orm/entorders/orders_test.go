package entorders_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/examples/orm/entorders"
	"github.com/oncekit/oncekit/examples/orm/ormtest"
)

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			w := ormtest.New(t)
			ctx := context.Background()
			id := uuid.New()
			stx, err := w.DB.BeginTx(ctx, nil)
			require.NoError(t, err)
			o, err := entorders.PlaceOrder(ctx, stx, w.Outbox, w.Subject, id, "ana", 4200)
			require.NoError(t, err)
			got, err := entorders.Client(stx).Order.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, o.Amount, got.Amount)
			eventID := oncekit.DeriveID(id.String(), "OrderPlaced")
			if commit {
				require.NoError(t, stx.Commit())
				w.RequireCommitted(id, eventID)
			} else {
				require.NoError(t, stx.Rollback())
				w.RequireRolledBack(id, eventID)
			}
		})
	}
}
