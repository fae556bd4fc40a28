package sideeffect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/retention"
)

// ErrNotFound is returned when no effect has the given ID.
var ErrNotFound = errors.New("sideeffect: effect not found")

// Filter selects effects for List.
type Filter struct {
	// State, when set, selects only effects in that state.
	State State
	// Kind, when set, selects only effects of that kind.
	Kind string
	// AfterID pages: only effects with a greater ID.
	AfterID int64
	// Limit caps the number of rows. Defaults to 100.
	Limit int
}

// List returns effects matching f in ID order.
func (l *Ledger) List(ctx context.Context, q oncekit.Querier, f Filter) ([]Row, error) {
	if f.State != "" && !f.State.Valid() {
		return nil, fmt.Errorf("sideeffect: list: unknown state %q", f.State)
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, l.sql.list, string(f.State), f.Kind, f.AfterID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanRow)
	if err != nil {
		return nil, fmt.Errorf("sideeffect: list: %w", err)
	}
	return out, nil
}

// Get returns the effect with the given ID, or ErrNotFound.
func (l *Ledger) Get(ctx context.Context, q oncekit.Querier, id int64) (Row, error) {
	rows, err := q.Query(ctx, l.sql.get, id)
	if err != nil {
		return Row{}, fmt.Errorf("sideeffect: get %d: %w", id, err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, scanRow)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return Row{}, fmt.Errorf("sideeffect: get %d: %w", id, err)
	}
	return r, nil
}

func scanRow(row pgx.CollectableRow) (Row, error) {
	var r Row
	var state string
	err := row.Scan(&r.ID, &r.SourceID, &r.Kind, &r.Payload, &r.Key, &state, &r.Attempts, &r.NextAttemptAt,
		&r.LeaseOwner, &r.LeaseExpiresAt, &r.ProviderRef, &r.LastError,
		&r.ResolvedBy, &r.ResolutionNote, &r.ResolvedAt,
		&r.CreatedAt, &r.FiredAt, &r.ConfirmedAt, &r.UpdatedAt)
	r.State = State(state)
	return r, err
}

// ErrWrongState is returned (wrapped, naming the current state) when an
// operator action does not apply to the effect's state: Retry needs failed
// or unknown, Resolve needs unknown.
var ErrWrongState = errors.New("sideeffect: effect is in the wrong state")

// Decision is an operator's decision, recorded on the effect.
type Decision struct {
	// By names who decided. Required.
	By string
	// Note says why. Required.
	Note string
	// ProviderRef optionally records the provider's reference when the
	// operator confirmed the effect at the provider.
	ProviderRef string
}

func (d Decision) validate() error {
	if d.By == "" {
		return errors.New("sideeffect: decision: By is required")
	}
	if d.Note == "" {
		return errors.New("sideeffect: decision: Note is required")
	}
	return nil
}

// Retry moves a failed or unknown effect back to pending, due now, with the
// SAME idempotency key, and records who decided and why. Use it when the
// operator knows the provider did not act (or honours the key).
func (l *Ledger) Retry(ctx context.Context, q oncekit.Querier, id int64, d Decision) error {
	if err := d.validate(); err != nil {
		return err
	}
	var st string
	err := q.QueryRow(ctx, l.sql.retry, id, d.By, d.Note).Scan(&st)
	return l.actionErr(ctx, q, "retry", id, err)
}

// Resolve records the operator's decision on an unknown effect: to is
// StateConfirmed (the provider did act) or StateFailed (it did not, and the
// effect is abandoned). Nothing is fired.
func (l *Ledger) Resolve(ctx context.Context, q oncekit.Querier, id int64, to State, d Decision) error {
	if to != StateConfirmed && to != StateFailed {
		return fmt.Errorf("sideeffect: resolve: to must be confirmed or failed, not %q", to)
	}
	if err := d.validate(); err != nil {
		return err
	}
	var st string
	err := q.QueryRow(ctx, l.sql.resolve, id, string(to), d.By, d.Note, d.ProviderRef).Scan(&st)
	return l.actionErr(ctx, q, "resolve", id, err)
}

// actionErr turns "no row updated" into ErrNotFound or ErrWrongState.
func (l *Ledger) actionErr(ctx context.Context, q oncekit.Querier, op string, id int64, err error) error {
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("sideeffect: %s %d: %w", op, id, err)
	}
	r, gerr := l.Get(ctx, q, id)
	if gerr != nil {
		return gerr
	}
	return fmt.Errorf("%w: %s %d: effect is %s", ErrWrongState, op, id, r.State)
}

// Prune runs one retention pass: it deletes every confirmed or failed effect
// recorded before before, batch rows per statement (1000 when batch is not
// positive), and returns how many it deleted. Each statement starts where the
// previous one ended, in the table's physical order, so a pass reads each
// page a bounded number of times however many rows it deletes. One pass at
// a time works on the ledger: a pass that finds another under way leaves the
// rows to it and returns. An effect an operator retries meanwhile stays. It
// runs its statements as fast as q takes them; Dispatcher.Prune calls it
// with its Retention and RetentionBatch, spaced to RetentionRate. A pruned
// effect can be recorded (and fired) again: keep rows longer than any
// redelivery or retry of their source.
func (l *Ledger) Prune(ctx context.Context, q oncekit.Querier, before time.Time, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	n, err := retention.PruneInTIDOrder(ctx, q, l.sql.pruneBounds, l.sql.prune, []any{before}, batch)
	if err != nil {
		return n, fmt.Errorf("sideeffect: prune: %w", err)
	}
	return n, nil
}
