// Code in the shape sqlc generates from query.sql (see sqlc.yaml).

package sqlcorders

import (
	"github.com/google/uuid"
)

// Order is a row of orders.
type Order struct {
	ID       uuid.UUID
	Customer string
	Amount   int64
}
