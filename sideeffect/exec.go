package sideeffect

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// genericPlan makes the rest of the implicit transaction it runs in use
// generic plans for prepared statements. The dispatcher's statements take
// arrays and a LIMIT as parameters, so PostgreSQL's default (plan_cache_mode
// auto) judges a custom plan cheaper and plans every execution again: about
// 0.2–0.5 ms of backend CPU per statement, as much as executing a claim of 30
// rows. The generic plans are the same plans (index scan on the due index,
// TID scan, primary-key nested loop), built once per connection.
//
// Sorts are off for the same statement: a claim reads the due index in its
// order and stops after LIMIT rows. The index also holds the rows in flight
// (a claim leaves a row at its due time), so a planner without statistics
// on how few of its rows are pending (none yet, or stale ones) prefers to
// read every due row and sort them, for each claim: ten times the CPU of
// the ordered scan, measured on 20,000 effects.
const genericPlan = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_sort', 'off', true)`

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
