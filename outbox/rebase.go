package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// RebaseResult reports what Rebase did.
type RebaseResult struct {
	// Moved is false when nothing was ahead of the server: nothing changed.
	Moved bool
	// Partitions is the number of partitions whose cursor was set.
	Partitions int
	// Published counts the rows kept published (behind the new cursors).
	Published int64
	// Held counts the rows kept held behind the cursors (waiting for a
	// retry, parked, or following a blocked row of their key).
	Held int64
	// Pending counts the unpublished rows written before the move, placed
	// right after the cursors in the order they had.
	Pending int64
	// New counts the rows written since the move, placed after those, in
	// the order they had.
	New int64
	// BurnedXIDs is the number of transaction IDs consumed to make room
	// below the server's snapshot xmin (0 unless the unpublished rows
	// needed more transaction IDs than the server had produced).
	BurnedXIDs int64
}

// rebaseAttempts bounds Rebase's rounds of making room.
const rebaseAttempts = 5

// Rebase makes the outbox consistent with the server it is on after the
// database was restored from a dump into another cluster, or moved to one by
// logical replication: the rows and cursors recorded there carry the old
// cluster's transaction IDs, ahead of the new one's (the relay refuses to run
// with ErrClusterMoved). In one transaction, with the outbox and the
// partitions locked against writers and relays, it gives every row a
// transaction ID below the server's snapshot xmin, per partition in this
// order: the published rows; the held rows, in the order they had; the
// cursor; the rows written before the move and not yet published, in the
// order they had; the rows written since the move, in the order they had.
// So published rows stay published, nothing is skipped, and each key's
// order is kept. Every partition lease ends (its fencing token bumped), so
// a relay still holding one publishes nothing more under it.
//
// A row's space is told by its transaction ID: at or after the server's
// next one, it was written before the move; so is any row with a lower
// sequence number than such a row (the identity sequence travels with the
// dump). The rows the migrations carried over from before migration 005
// (transaction 1) stay where they are. When the rows to order need more
// transaction IDs than the server has produced, Rebase consumes the
// difference first (RebaseResult.BurnedXIDs).
//
// Rebase changes nothing, and reports Moved false, when no cursor and no
// row is ahead of the server: running it twice, or on a database that was
// never moved, is harmless. db must not be a transaction (Rebase commits its
// own, and commits the transaction IDs it consumes one by one): a pool or a
// connection. Stop the relays first; see docs/operations.md, "Moving to
// another cluster".
func (o *Outbox) Rebase(ctx context.Context, db oncekit.DB) (RebaseResult, error) {
	sql := renderRebaseSQL(o.schema)
	var burned int64
	for attempt := 0; ; attempt++ {
		res, short, err := o.rebaseOnce(ctx, db, sql)
		res.BurnedXIDs = burned
		if err != nil || short == 0 {
			return res, err
		}
		if attempt == rebaseAttempts {
			return res, fmt.Errorf("outbox: rebase: %d more transaction IDs are needed below the snapshot's xmin "+
				"after %d rounds: a long transaction holds the xmin back; end it and run rebase again", short, attempt)
		}
		// Make room: the xmin follows once no older transaction runs.
		n := short + 1000
		if _, err := db.Exec(ctx, fmt.Sprintf(sql.burn, n)); err != nil {
			return res, fmt.Errorf("outbox: rebase: consume transaction IDs: %w", err)
		}
		burned += n
	}
}

// rebaseOnce runs one attempt; short > 0 reports the transaction IDs
// missing below the snapshot's xmin, in which case nothing changed.
func (o *Outbox) rebaseOnce(ctx context.Context, db oncekit.DB, sql rebaseSQL) (res RebaseResult, short int64, err error) {
	err = pgx.BeginTxFunc(ctx, beginner{db}, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sql.lock); err != nil {
			return fmt.Errorf("lock the outbox: %w", err)
		}
		var ahead bool
		var need, room int64
		if err := tx.QueryRow(ctx, sql.plan).Scan(&ahead, &need, &room,
			&res.Published, &res.Held, &res.Pending, &res.New); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		if !ahead {
			res = RebaseResult{}
			return nil
		}
		if need > room {
			short = need - room
			return errRebaseShort
		}
		var rows int64
		if err := tx.QueryRow(ctx, sql.apply).Scan(&rows, &res.Partitions); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
		if _, err := tx.Exec(ctx, o.sql.notifyAll, o.channel, notifyAll); err != nil {
			return fmt.Errorf("notify: %w", err)
		}
		res.Moved = true
		return nil
	})
	if errors.Is(err, errRebaseShort) {
		return res, short, nil
	}
	if err != nil {
		return RebaseResult{}, 0, fmt.Errorf("outbox: rebase: %w", err)
	}
	return res, 0, nil
}

var errRebaseShort = errors.New("not enough transaction IDs below the xmin")

// beginner adapts an oncekit.DB to pgx.BeginTxFunc's interface, beginning
// with options where the DB allows them.
type beginner struct{ db oncekit.DB }

func (b beginner) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if tb, ok := b.db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return tb.BeginTx(ctx, opts)
	}
	return b.db.Begin(ctx)
}

type rebaseSQL struct{ lock, plan, apply, burn string }

// rebaseRanks classifies every row (but those of transaction 1) and ranks
// it within its partition. x: the snapshot; old: the highest seq of a row
// written before the move (at or after the snapshot's xmax); c: the
// cursors, and whether each is before the move; k: each row's group, 0
// published, 1 held behind the cursor, 2 unpublished from before the move,
// 3 written since, behind meaning at or before the cursor and on the
// cursor's side of the move; r: the dense rank of (group, txid) per
// partition, published rows sharing one; n: per partition, how many ranks
// lie behind the cursor and in all.
var rebaseRanks = `WITH x AS (SELECT pg_snapshot_xmin(s) AS xmin, pg_snapshot_xmax(s) AS xmax FROM pg_current_snapshot() s),
	old AS (SELECT coalesce(max(o.seq), 0) AS seq FROM {schema}.outbox o, x WHERE o.txid >= x.xmax),
	c AS (SELECT p.partition, p.cursor_txid, p.cursor_seq, p.cursor_txid >= x.xmax AS before FROM {schema}.relay_partitions p, x),
	k AS (
		SELECT o.seq, o.partition, o.txid, b.before,
			CASE WHEN (o.txid, o.seq) <= (c.cursor_txid, c.cursor_seq) AND b.before = c.before
				THEN CASE WHEN ` + held("o") + ` THEN 1 ELSE 0 END
				WHEN b.before THEN 2 ELSE 3 END AS g
		FROM {schema}.outbox o JOIN c ON c.partition = o.partition, x, old,
			LATERAL (SELECT o.txid >= x.xmax OR o.seq <= old.seq AS before) b
		WHERE o.txid <> '1'),
	r AS (
		SELECT seq, partition, g, dense_rank() OVER (PARTITION BY partition ORDER BY g, CASE WHEN g = 0 THEN '0'::xid8 ELSE txid END) AS rk
		FROM k),
	n AS (SELECT partition, coalesce(max(rk) FILTER (WHERE g <= 1), 0) AS behind, max(rk) AS total FROM r GROUP BY partition)`

// The first transaction ID Rebase hands out: 1 is the migrated rows' and 2
// the cursor before every row.
const rebaseBase = 3

func renderRebaseSQL(schema string) rebaseSQL {
	q := rebaseSQL{
		// Writers' INSERTs, the relays' cursor moves and lease changes, and
		// retention's DELETEs wait; reads go on.
		lock: `LOCK TABLE {schema}.relay_partitions, {schema}.outbox IN SHARE ROW EXCLUSIVE MODE`,
		// Whether anything is ahead of the server; the highest transaction ID
		// the new order needs (the base, the ranks, one for the cursor) and
		// the room below the xmin; the rows of each group.
		plan: rebaseRanks + `
			SELECT EXISTS (SELECT 1 FROM c WHERE c.before) OR (SELECT seq FROM old) > 0,
				coalesce((SELECT max(total) FROM n), 0) + ` + fmt.Sprint(rebaseBase) + `,
				(SELECT xmin::text::numeric FROM x)::int8 - 1,
				(SELECT count(*) FROM r WHERE g = 0), (SELECT count(*) FROM r WHERE g = 1),
				(SELECT count(*) FROM r WHERE g = 2), (SELECT count(*) FROM r WHERE g = 3)`,
		// Every row's new transaction ID: ranks behind the cursor from the
		// base, the cursor next, the rest after it. Every lease ends.
		apply: rebaseRanks + `,
			u AS (
				UPDATE {schema}.outbox o
				SET txid = (` + fmt.Sprint(rebaseBase) + ` - 1 + r.rk + CASE WHEN r.g <= 1 THEN 0 ELSE 1 END)::text::xid8
				FROM r WHERE o.seq = r.seq
				RETURNING 1),
			p AS (
				UPDATE {schema}.relay_partitions rp
				SET cursor_txid = (` + fmt.Sprint(rebaseBase) + ` + coalesce(n.behind, 0))::text::xid8, cursor_seq = 0,
					owner = NULL, token = rp.token + 1, expires_at = '-infinity'
				FROM c LEFT JOIN n ON n.partition = c.partition
				WHERE rp.partition = c.partition
				RETURNING 1)
			SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM p)::int`,
		// %d transaction IDs, each committed on its own (a DO block may
		// commit when it is the top-level statement).
		burn: `DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`,
	}
	for _, p := range []*string{&q.lock, &q.plan, &q.apply} {
		*p = pgsql.Render(*p, schema)
	}
	return q
}
