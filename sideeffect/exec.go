package sideeffect

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// batcher is implemented by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// exec runs one dispatcher statement on its own and hands its rows to scan.
// When exec returns nil the statement has committed. On a db that sends
// batches the statement follows genericPlan in the same round trip and the
// same implicit transaction (the setting ends with it); on any other db it
// runs after genericPlan in a transaction of its own (three more round
// trips, but the same plans).
func (d *Dispatcher) exec(ctx context.Context, sql string, args []any, scan func(pgx.Rows) error) error {
	if b, ok := d.db.(batcher); ok {
		batch := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
		batch.Queue(genericPlan)
		batch.Queue(sql, args...).Query(scan)
		return b.SendBatch(ctx, batch).Close()
	}
	tx, err := d.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, genericPlan); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if err := scan(rows); err != nil {
		return err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
