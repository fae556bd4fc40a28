package bunorders_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/examples/orm/bunorders"
	"github.com/oncekit/oncekit/examples/orm/ormtest"
)

var errRollback = errors.New("roll back")

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			w := ormtest.New(t)
			db := bun.NewDB(w.DB, pgdialect.New())
			ctx := context.Background()
			o := &bunorders.Order{ID: uuid.New(), Customer: "ana", Amount: 4200}
			err := db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				if err := bunorders.PlaceOrder(ctx, tx, w.Outbox, w.Subject, o); err != nil {
					return err
				}
				var got bunorders.Order
				if err := tx.NewSelect().Model(&got).Where("id = ?", o.ID).Scan(ctx); err != nil {
					return err
				}
				require.Equal(t, *o, got)
				if !commit {
					return errRollback
				}
				return nil
			})
			eventID := oncekit.DeriveID(o.ID.String(), "OrderPlaced")
			if commit {
				require.NoError(t, err)
				w.RequireCommitted(o.ID, eventID)
			} else {
				require.ErrorIs(t, err, errRollback)
				w.RequireRolledBack(o.ID, eventID)
			}
		})
	}
}
