package drift

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// check is one query yielding a figure.
type check struct {
	name  string
	limit float64
	run   func(ctx context.Context, db oncekit.Querier) (Finding, error)
}

// backlog is a check on what the outbox has yet to publish, read through
// Outbox.Unpublished, which knows the schema's mode: in logical mode the
// events are WAL messages, the table holds no backlog, and the oldest is
// as old as the slot's lag in time.
func backlog(name string, limit float64, c Config, figure func(outbox.Unpublished) float64) check {
	ob, err := outbox.New(&outbox.Config{Schema: c.Schema, Slot: c.Slot})
	return check{name: name, limit: limit, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		if err != nil {
			return Finding{}, err
		}
		u, err := ob.Unpublished(ctx, db)
		if err != nil {
			return Finding{}, err
		}
		v := figure(u)
		f := Finding{Value: v, Limit: limit, Drift: v > limit}
		if f.Drift && u.Logical {
			f.Examples = []string{fmt.Sprintf("logical mode: the events are WAL messages; replication slot %s lags %d bytes", u.Slot.Name, u.Slot.LagBytes)}
		}
		return f, nil
	}}
}

func secs(d time.Duration) float64 { return d.Seconds() }

// slot is a check on the logical relay's replication slot, which the
// outbox reads: a schema without logical mode set up yields 0. A lost
// slot is drift whatever the figure, with an example saying why.
func slot(name string, limit float64, c Config, figure func(outbox.SlotStatus) float64) check {
	ob, err := outbox.New(&outbox.Config{Schema: c.Schema, Slot: c.Slot})
	return check{name: name, limit: limit, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		if err != nil {
			return Finding{}, err
		}
		s, err := ob.SlotStatus(ctx, db)
		if err != nil {
			return Finding{}, err
		}
		v := figure(s)
		f := Finding{Value: v, Limit: limit, Drift: v > limit}
		switch {
		case s.Lost:
			f.Drift = true
			f.Examples = []string{fmt.Sprintf("replication slot %s is lost (exists %v, wal_status %q): the logical relay stops; docs/runbook.md",
				s.Name, s.Exists, s.WALStatus)}
		case f.Drift:
			f.Examples = []string{fmt.Sprintf("replication slot %s: active %v, lag %d bytes, WAL retained %d bytes",
				s.Name, s.Active, s.LagBytes, s.RetainedBytes)}
		}
		return f, nil
	}}
}

// item is an offending row as a listed check reports it: its ID and a
// line describing it.
type item struct{ id, label string }

// listed is a check on the rows an owner's read lists (the first MaxIDs)
// and counts (total): the value is the count, the IDs those listed, the
// first few labels the examples.
func listed(name string, read func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error), c Config) check {
	return check{name: name, run: func(ctx context.Context, db oncekit.Querier) (Finding, error) {
		items, total, err := read(ctx, db, c.MaxIDs)
		if err != nil {
			return Finding{}, err
		}
		var f Finding
		for _, it := range items {
			f.IDs = append(f.IDs, it.id)
			if len(f.Examples) < maxExamples {
				f.Examples = append(f.Examples, it.label)
			}
		}
		f.Value = float64(total)
		f.Drift = f.Value > 0
		return f, nil
	}}
}

// items turns an owner's rows into items.
func items[T any](rows []T, total int64, err error, of func(T) item) ([]item, int64, error) {
	out := make([]item, 0, len(rows))
	for _, r := range rows {
		out = append(out, of(r))
	}
	return out, total, err
}

// effectItem describes a side effect with what follows its kind and
// source.
func effectItem(e sideeffect.Row, rest string) item {
	id := strconv.FormatInt(e.ID, 10)
	return item{id, "effect " + id + " (" + e.Kind + " of " + e.SourceID + ")" + rest}
}

// stamp is t as examples show times: UTC, to the second.
func stamp(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

// quoted is s as a string literal of SQL (PostgreSQL's quote_literal),
// which the examples have always shown keys in.
func quoted(s string) string {
	q := "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", "''") + "'"
	if strings.Contains(s, `\`) {
		q = "E" + q
	}
	return q
}

// first is s cut to n characters.
func first(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// or is s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// builtins are the checks every deployment gets. Each reads through the
// package that owns the table, through an index (or the small partial
// ones) so that it stays cheap on large tables.
func builtins(c Config) []check {
	ob, obErr := outbox.New(&outbox.Config{Schema: c.Schema, Slot: c.Slot})
	store, storeErr := inbox.NewStore(c.Schema)
	ledger, ledgerErr := sideeffect.New(&sideeffect.Config{Schema: c.Schema})
	records, recordsErr := idempotency.NewRecords(c.Schema)
	err := errors.Join(obErr, storeErr, ledgerErr, recordsErr)
	// read guards every read with the owners' construction, which fails
	// only for a schema New refuses.
	read := func(f func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error)) func(context.Context, oncekit.Querier, int) ([]item, int64, error) {
		return func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			if err != nil {
				return nil, 0, err
			}
			return f(ctx, db, limit)
		}
	}
	return []check{
		// Rows: in logical mode the rows written before the switch.
		backlog("outbox_backlog", float64(c.MaxOutboxBacklog), c,
			func(u outbox.Unpublished) float64 { return float64(u.Rows.Pending) }),
		backlog("outbox_oldest_age_seconds", secs(c.MaxOutboxAge), c,
			func(u outbox.Unpublished) float64 { return u.OldestAge().Seconds() }),
		// Logical mode: the slot's lag, and the WAL an inactive slot
		// keeps (nothing reads it; it fills the primary's disk).
		slot("outbox_slot_lag_bytes", float64(c.MaxSlotLagBytes), c,
			func(s outbox.SlotStatus) float64 { return float64(s.LagBytes) }),
		slot("outbox_slot_inactive_retained_bytes", float64(c.MaxInactiveSlotRetainedBytes), c,
			func(s outbox.SlotStatus) float64 {
				if s.Active {
					return 0
				}
				return float64(s.RetainedBytes)
			}),
		listed("outbox_parked", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := ob.Parked(ctx, db, limit)
			return items(rows, total, err, func(m outbox.ParkedMessage) item {
				return item{m.ID.String(), "message " + m.ID.String() + " (key " + quoted(m.Key) + ", " + m.Subject + ", " +
					strconv.Itoa(m.Attempts) + " attempts)"}
			})
		}), c),
		listed("effects_fired_past_lease", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := ledger.FiredPastLease(ctx, db, c.LeaseGrace, limit)
			return items(rows, total, err, func(e sideeffect.Row) item {
				return effectItem(e, " fired, lease expired "+stamp(e.LeaseExpiresAt))
			})
		}), c),
		listed("effects_unknown", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := ledger.Unknown(ctx, db, limit)
			return items(rows, total, err, func(e sideeffect.Row) item { return effectItem(e, ": "+or(e.LastError, "unknown")) })
		}), c),
		listed("effects_pending_overdue", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := ledger.PendingOverdue(ctx, db, c.MaxPendingAge, limit)
			return items(rows, total, err, func(e sideeffect.Row) item { return effectItem(e, " due "+stamp(e.NextAttemptAt)) })
		}), c),
		listed("effects_failed", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := ledger.FailedWithin(ctx, db, c.FailedWindow, limit)
			return items(rows, total, err, func(e sideeffect.Row) item { return effectItem(e, ": "+or(e.LastError, "failed")) })
		}), c),
		// Keys are never shown: tenant and operation only.
		listed("idempotency_in_progress_past_lease", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := records.PastLease(ctx, db, c.LeaseGrace, limit)
			return items(rows, total, err, func(k idempotency.HeldRecord) item {
				return item{k.Tenant + "/" + k.Operation + "/" + fmt.Sprintf("%x", md5.Sum([]byte(k.StoredKey))),
					"tenant " + quoted(k.Tenant) + ", operation " + quoted(k.Operation) + ", lease expired " + stamp(k.LockedUntil)}
			})
		}), c),
		// Unknown outcomes wait for a reconciliation or an operator
		// (oncekit edge resolve).
		listed("idempotency_unknown", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := records.Unknown(ctx, db, limit)
			return items(rows, total, err, func(k idempotency.HeldRecord) item {
				return item{k.Tenant + "/" + k.Operation + "/" + k.StoredKey, "tenant " + quoted(k.Tenant) + ", operation " +
					quoted(k.Operation) + ", stored key " + first(k.StoredKey, 16) + ": " + first(or(k.UnknownReason, "unknown"), 120)}
			})
		}), c),
		listed("dead_letters", read(func(ctx context.Context, db oncekit.Querier, limit int) ([]item, int64, error) {
			rows, total, err := store.Waiting(ctx, db, limit)
			return items(rows, total, err, func(d inbox.DeadLetterSummary) item {
				id := strconv.FormatInt(d.ID, 10)
				return item{id, "dead letter " + id + " (consumer " + d.Consumer + ", message " + or(d.MessageID, "-") + "): " +
					first(d.Reason, 120)}
			})
		}), c),
	}
}
