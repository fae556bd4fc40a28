package oncekit_test

import (
	"context"
	"database/sql"
	"log"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
)

// An order written through database/sql (or an ORM on it) and its event
// commit together: the event goes into the outbox in the same *sql.Tx.
func ExampleFromSQLTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool) // or sql.Open("pgx", url)
	ob, err := outbox.New(&outbox.Config{Schema: "oncekit"})
	if err != nil {
		log.Fatal(err)
	}
	orderID := uuid.New()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer stx.Rollback()
	if _, err := stx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES ($1, 100)`, orderID); err != nil {
		log.Fatal(err)
	}
	tx, err := oncekit.FromSQLTx(ctx, stx) // ErrNotPgx for another driver, sql.ErrTxDone once ended
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ob.Enqueue(ctx, tx, broker.Message{
		ID: oncekit.DeriveID(orderID.String(), "OrderCreated"), Subject: "orders.created", Payload: []byte(`{}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := stx.Commit(); err != nil { // the order and its event, or neither
		log.Fatal(err)
	}
}

// An inbox handler writes through database/sql in the claim's transaction:
// its row commits with the claim, or neither does.
func ExampleWithSQLTx() {
	handler := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		return oncekit.WithSQLTx(ctx, tx, func(stx *sql.Tx) error {
			// gorm.Open(postgres.New(postgres.Config{Conn: stx})), bun's
			// NewInsert().Conn(stx), an ent client on stx, sqlc's New(stx)...
			_, err := stx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, msg.ID)
			return err // an error rolls back the handler's writes
		})
	})
	_ = handler
}
