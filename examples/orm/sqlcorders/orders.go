// Package sqlcorders places an order with sqlc's queries over database/sql:
// the order row, its event in the outbox and its receipt in the side-effect
// ledger, in one *sql.Tx.
package sqlcorders

import (
	"context"
	"database/sql"
	"encoding/json"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// Service places orders.
type Service struct {
	DB      *sql.DB // pgx's stdlib driver: stdlib.OpenDBFromPool or sql.Open("pgx", …)
	Outbox  *outbox.Outbox
	Ledger  *sideeffect.Ledger
	Subject string // the OrderPlaced events' subject
}

// PlaceOrder writes the order, its OrderPlaced event and its receipt email
// in stx: all three commit with stx, or none does.
func (s *Service) PlaceOrder(ctx context.Context, stx *sql.Tx, o CreateOrderParams) (Order, error) {
	order, err := New(s.DB).WithTx(stx).CreateOrder(ctx, o)
	if err != nil {
		return Order{}, err
	}
	tx, err := oncekit.FromSQLTx(ctx, stx)
	if err != nil {
		return Order{}, err
	}
	payload, _ := json.Marshal(order)
	if _, err := s.Outbox.Enqueue(ctx, tx, broker.Message{
		ID: oncekit.DeriveID(order.ID.String(), "OrderPlaced"), Subject: s.Subject, Key: order.Customer, Payload: payload,
	}); err != nil {
		return Order{}, err
	}
	if _, err := s.Ledger.Record(ctx, tx, sideeffect.Effect{
		SourceID: order.ID.String(), Kind: "email.receipt", Payload: payload,
	}); err != nil {
		return Order{}, err
	}
	return order, nil
}
