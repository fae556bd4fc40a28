// Package gormorders places orders with GORM: the order row and its event
// in the outbox commit in GORM's transaction, and an inbox handler writes
// through GORM in the claim's transaction.
package gormorders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
)

// Order is a row of orders.
type Order struct {
	ID       uuid.UUID `gorm:"type:uuid;primaryKey"`
	Customer string
	Amount   int64
}

// ErrNotInTransaction reports a *gorm.DB outside a transaction.
var ErrNotInTransaction = errors.New("gormorders: call inside a GORM transaction (db.Transaction)")

// PlaceOrder writes o and its OrderPlaced event in db's transaction (the
// *gorm.DB that db.Transaction hands its function): both commit with it, or
// neither does.
func PlaceOrder(ctx context.Context, db *gorm.DB, ob *outbox.Outbox, subject string, o *Order) error {
	stx, ok := db.Statement.ConnPool.(*sql.Tx)
	if !ok {
		return ErrNotInTransaction
	}
	if err := db.WithContext(ctx).Create(o).Error; err != nil {
		return err
	}
	tx, err := oncekit.FromSQLTx(ctx, stx)
	if err != nil {
		return err
	}
	payload, _ := json.Marshal(o)
	_, err = ob.Enqueue(ctx, tx, broker.Message{
		ID: oncekit.DeriveID(o.ID.String(), "OrderPlaced"), Subject: subject, Key: o.Customer, Payload: payload,
	})
	return err
}

// Handler is an inbox handler that writes the order a message carries
// through GORM, in the claim's transaction: the order and the claim commit
// together. An order without an amount is refused (dead-lettered), and
// nothing of it is written.
func Handler(gdb *gorm.DB) inbox.Handler {
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		var o Order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return inbox.Permanent(err)
		}
		return oncekit.WithSQLTx(ctx, tx, func(stx *sql.Tx) error {
			db := OnTx(ctx, gdb, stx)
			if err := db.Create(&o).Error; err != nil {
				return err
			}
			if o.Amount <= 0 {
				return inbox.Permanent(errors.New("order without an amount"))
			}
			return nil
		})
	})
}

// OnTx is gdb running its statements in stx, as GORM's own Begin sets it.
// (A Session with a Context has a Statement of its own to set.)
func OnTx(ctx context.Context, gdb *gorm.DB, stx *sql.Tx) *gorm.DB {
	db := gdb.Session(&gorm.Session{NewDB: true, Context: ctx, SkipDefaultTransaction: true})
	db.Statement.ConnPool = stx
	return db
}
