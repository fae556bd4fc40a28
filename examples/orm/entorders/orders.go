// Package entorders places orders with ent over pgx's database/sql driver:
// an ent client on the *sql.Tx writes the order, and its event goes into
// the outbox in the same transaction.
package entorders

import (
	"context"
	"database/sql"
	"encoding/json"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/google/uuid"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/orm/entorders/ent"
	"github.com/oncekit/oncekit/outbox"
)

// Client is an ent client whose statements run in stx.
func Client(stx *sql.Tx) *ent.Client {
	return ent.NewClient(ent.Driver(entsql.NewDriver(dialect.Postgres, entsql.Conn{ExecQuerier: stx})))
}

// PlaceOrder writes the order and its OrderPlaced event in stx: both commit
// with it, or neither does.
func PlaceOrder(ctx context.Context, stx *sql.Tx, ob *outbox.Outbox, subject string, id uuid.UUID, customer string, amount int64) (*ent.Order, error) {
	o, err := Client(stx).Order.Create().SetID(id).SetCustomer(customer).SetAmount(amount).Save(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := oncekit.FromSQLTx(ctx, stx)
	if err != nil {
		return nil, err
	}
	payload, _ := json.Marshal(o)
	if _, err := ob.Enqueue(ctx, tx, broker.Message{
		ID: oncekit.DeriveID(o.ID.String(), "OrderPlaced"), Subject: subject, Key: customer, Payload: payload,
	}); err != nil {
		return nil, err
	}
	return o, nil
}
