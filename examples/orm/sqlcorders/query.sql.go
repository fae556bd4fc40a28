// Code in the shape sqlc generates from query.sql (see sqlc.yaml).
// source: query.sql

package sqlcorders

import (
	"context"

	"github.com/google/uuid"
)

const createOrder = `-- name: CreateOrder :one
INSERT INTO orders (id, customer, amount) VALUES ($1, $2, $3)
RETURNING id, customer, amount
`

// CreateOrderParams are CreateOrder's arguments.
type CreateOrderParams struct {
	ID       uuid.UUID
	Customer string
	Amount   int64
}

// CreateOrder inserts an order.
func (q *Queries) CreateOrder(ctx context.Context, arg CreateOrderParams) (Order, error) {
	row := q.db.QueryRowContext(ctx, createOrder, arg.ID, arg.Customer, arg.Amount)
	var i Order
	err := row.Scan(&i.ID, &i.Customer, &i.Amount)
	return i, err
}

const getOrder = `-- name: GetOrder :one
SELECT id, customer, amount FROM orders WHERE id = $1
`

// GetOrder reads an order.
func (q *Queries) GetOrder(ctx context.Context, id uuid.UUID) (Order, error) {
	row := q.db.QueryRowContext(ctx, getOrder, id)
	var i Order
	err := row.Scan(&i.ID, &i.Customer, &i.Amount)
	return i, err
}
