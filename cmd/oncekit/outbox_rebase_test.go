package main

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// A database restored into another cluster: its cursors and one
// unpublished row carry transaction IDs 5 epochs ahead of the server's, and
// a row was written since with one of the server's. `oncekit relay` exits 1
// naming the move and the command; `oncekit outbox rebase` moves the
// cursors, leaving both rows pending; run again, it has nothing to do.
func TestOutboxRebaseAfterARestore(t *testing.T) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	enqueue := func() uuid.UUID {
		id := uuid.New()
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(ctx, tx, broker.Message{ID: id, Subject: "moved.x", Key: "k", Payload: []byte("{}")})
			return err
		}))
		return id
	}
	old := enqueue()
	const ahead = `(pg_snapshot_xmax(pg_current_snapshot())::text::numeric + 5 * 4294967296)`
	_, err = db.Pool.Exec(ctx, `UPDATE relay_partitions SET cursor_txid = (`+ahead+` - 10)::text::xid8, cursor_seq = 0`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE outbox SET txid = `+ahead+`::text::xid8 WHERE id = $1`, old)
	require.NoError(t, err)
	later := enqueue()

	vars := dbVars(db)
	vars["NATS_URL"] = testenv.NewNATS(t).URL
	start := time.Now()
	code, _, stderr := cli(t, vars, "relay", "--listen", "", "--lease", "1s")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "transaction IDs behind the relay's cursor")
	require.Contains(t, stderr, "the database was restored or moved to another cluster")
	require.Contains(t, stderr, "run `oncekit outbox rebase`")
	require.Less(t, time.Since(start), 30*time.Second)
	t.Logf("oncekit relay: exit %d: %s", code, stderr)

	code, stdout, stderr := cli(t, vars, "outbox", "rebase")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "rebased the outbox onto this server's transaction IDs: 16 partitions; "+
		"0 published rows kept published, 0 held rows kept held, 1 rows from before the move to publish, "+
		"1 rows written since the move after them")
	t.Logf("oncekit outbox rebase: %s", stdout)

	entries, err := ob.List(ctx, db.Pool, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	for i, id := range []uuid.UUID{old, later} {
		require.Equal(t, id, entries[i].ID, "publishing order")
		require.Equal(t, outbox.StatePending, entries[i].State())
	}

	code, stdout, stderr = cli(t, vars, "outbox", "rebase")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "nothing to do")
}
