// Package bunorders places orders with Bun over pgx's database/sql driver:
// the order row and its event in the outbox commit in Bun's transaction.
package bunorders

import (
	"context"
	"encoding/json"

	"github.com/google/uuid"
	"github.com/uptrace/bun"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/outbox"
)

// Order is a row of orders.
type Order struct {
	bun.BaseModel `bun:"table:orders"`

	ID       uuid.UUID `bun:"id,pk,type:uuid"`
	Customer string    `bun:"customer"`
	Amount   int64     `bun:"amount"`
}

// PlaceOrder writes o and its OrderPlaced event in tx: both commit with it,
// or neither does. The *sql.Tx under a bun.Tx is its Tx field (a savepoint
// of bun's, with a name, shares its parent's).
func PlaceOrder(ctx context.Context, tx bun.Tx, ob *outbox.Outbox, subject string, o *Order) error {
	if _, err := tx.NewInsert().Model(o).Exec(ctx); err != nil {
		return err
	}
	ptx, err := oncekit.FromSQLTx(ctx, tx.Tx)
	if err != nil {
		return err
	}
	payload, _ := json.Marshal(o)
	_, err = ob.Enqueue(ctx, ptx, broker.Message{
		ID: oncekit.DeriveID(o.ID.String(), "OrderPlaced"), Subject: subject, Key: o.Customer, Payload: payload,
	})
	return err
}
