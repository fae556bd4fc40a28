package oncekittest

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// maxListed bounds the outbox rows RequireEnqueued looks through.
const maxListed = 100_000

// RequireEnqueued fails tb unless ob's outbox holds the message id (pending,
// parked, or published and not yet deleted by retention), and returns it.
// Given the transaction that enqueued it, it sees the row before the commit.
func RequireEnqueued(ctx context.Context, tb testing.TB, db oncekit.Querier, ob *outbox.Outbox, id uuid.UUID) outbox.Entry {
	tb.Helper()
	entries, err := ob.List(ctx, db, outbox.ListOptions{Limit: maxListed})
	if err != nil {
		tb.Fatalf("oncekittest: list the outbox: %v", err)
	}
	for _, e := range entries {
		if e.ID == id {
			return e
		}
	}
	tb.Fatalf("oncekittest: message %s is not in the outbox (%d rows there)", id, len(entries))
	return outbox.Entry{}
}

// RequireEffect fails tb unless l's ledger holds the effect (sourceID,
// kind), and returns it: its State, Attempts and ProviderRef show how far it
// got. Given the transaction that recorded it, it sees the row before the
// commit.
func RequireEffect(ctx context.Context, tb testing.TB, db oncekit.Querier, l *sideeffect.Ledger, sourceID, kind string) sideeffect.Row {
	tb.Helper()
	rows, err := effects(ctx, db, l, sideeffect.Filter{Kind: kind})
	if err != nil {
		tb.Fatalf("oncekittest: list the side effects: %v", err)
	}
	for _, r := range rows {
		if r.SourceID == sourceID {
			return r
		}
	}
	tb.Fatalf("oncekittest: no %s effect for source %q (%d effects of that kind)", kind, sourceID, len(rows))
	return sideeffect.Row{}
}

// effects lists every effect f selects, page by page.
func effects(ctx context.Context, db oncekit.Querier, l *sideeffect.Ledger, f sideeffect.Filter) ([]sideeffect.Row, error) {
	f.Limit = 1000
	var all []sideeffect.Row
	for {
		rows, err := l.List(ctx, db, f)
		if err != nil {
			return nil, err
		}
		all = append(all, rows...)
		if len(rows) < f.Limit {
			return all, nil
		}
		f.AfterID = rows[len(rows)-1].ID
	}
}
