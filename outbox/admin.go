package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// State selects rows for List.
type State string

// States of an outbox row.
const (
	// StatePending: not yet published, not parked (possibly waiting for a retry).
	StatePending State = "pending"
	// StateParked: failed MaxAttempts times; blocks its key until unparked.
	StateParked State = "parked"
	// StatePublished: acknowledged by the broker (kept until retention).
	StatePublished State = "published"
)

// ListOptions filters List.
type ListOptions struct {
	// State selects the rows; empty means all.
	State State
	// Limit bounds the rows returned. Defaults to 100.
	Limit int
}

// Entry is one outbox row as List reports it.
type Entry struct {
	Seq           int64
	ID            uuid.UUID
	Partition     int
	Key           string
	Subject       string
	PayloadSize   *int // nil for a message published before migration 005 (its payload was not kept)
	Headers       map[string]string
	CreatedAt     time.Time
	Attempts      int
	NextAttemptAt *time.Time
	LastError     string
	ParkedAt      *time.Time
	// Published is true once the broker acknowledged the message.
	Published bool
}

// State is the entry's state.
func (e Entry) State() State {
	switch {
	case e.Published:
		return StatePublished
	case e.ParkedAt != nil:
		return StateParked
	default:
		return StatePending
	}
}

// List returns outbox messages: pending and parked ones in publishing order
// (oldest first), then published ones (newest first), at most Limit of each.
func (o *Outbox) List(ctx context.Context, q oncekit.Querier, opts ListOptions) ([]Entry, error) {
	switch opts.State {
	case "", StatePending, StateParked, StatePublished:
	default:
		return nil, fmt.Errorf("outbox: ListOptions.State: unknown state %q", opts.State)
	}
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	rows, err := q.Query(ctx, o.sql.list, string(opts.State), opts.Limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		var headers []byte
		err := r.Scan(&e.Seq, &e.ID, &e.Partition, &e.Key, &e.Subject, &e.PayloadSize, &headers, &e.CreatedAt,
			&e.Attempts, &e.NextAttemptAt, &e.LastError, &e.ParkedAt, &e.Published)
		if err == nil && len(headers) > 0 {
			err = json.Unmarshal(headers, &e.Headers)
		}
		return e, err
	})
}

// Unpark releases the parked messages ids so that the relay tries them again
// with a fresh attempt count, and wakes listening relays. It returns how many
// rows were unparked; ids that are not parked are ignored.
func (o *Outbox) Unpark(ctx context.Context, q oncekit.Querier, ids ...uuid.UUID) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return o.unpark(ctx, q, false, ids)
}

// UnparkAll releases every parked message; see Unpark.
func (o *Outbox) UnparkAll(ctx context.Context, q oncekit.Querier) (int64, error) {
	return o.unpark(ctx, q, true, nil)
}

func (o *Outbox) unpark(ctx context.Context, q oncekit.Querier, all bool, ids []uuid.UUID) (int64, error) {
	tag, err := q.Exec(ctx, o.sql.unpark, all, pgsql.UUIDs(ids))
	if err != nil {
		return 0, fmt.Errorf("outbox: unpark: %w", err)
	}
	if tag.RowsAffected() > 0 {
		if _, err := q.Exec(ctx, o.sql.notifyAll, o.channel, notifyAll); err != nil {
			return tag.RowsAffected(), fmt.Errorf("outbox: unpark: notify: %w", err)
		}
	}
	return tag.RowsAffected(), nil
}
