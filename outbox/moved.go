package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// ErrClusterMoved is wrapped by the error a Relay returns when a partition's
// cursor, or one of its rows, carries a transaction ID that the server has
// not produced yet: the database was restored from a dump into another
// cluster, or moved to one by logical replication, and the new cluster's
// transaction IDs are behind what the outbox recorded. Left alone, the
// relay would read nothing: rows written on the new cluster sort before the
// cursor, and the old cluster's unpublished rows after every row the new
// cluster can make readable. Rebase moves the cursors; see
// docs/operations.md, "Moving to another cluster".
var ErrClusterMoved = errors.New("outbox: transaction IDs behind the relay's cursor")

// ClusterMovedError is the error of a relay that found the outbox ahead of
// its server (ErrClusterMoved). Nothing was published.
type ClusterMovedError struct {
	// Partition is the first partition found ahead.
	Partition int
	// Cursor is the partition's cursor transaction ID (xid8, as text)
	// when that one is ahead of the server ("" otherwise).
	Cursor string
	// Row is the highest transaction ID among the partition's rows, as
	// text, when that one is ahead of the server ("" otherwise).
	Row string
	// Next is the server's next transaction ID (its snapshot's xmax).
	Next string
}

// Error implements error: what happened and how to continue.
func (e *ClusterMovedError) Error() string {
	what := "its cursor is at transaction " + e.Cursor
	switch {
	case e.Cursor == "":
		what = "it holds rows of transaction " + e.Row
	case e.Row != "":
		what += " and it holds rows of transaction " + e.Row
	}
	return fmt.Sprintf("%v: partition %d: %s, but this server's next transaction ID is %s: "+
		"the database was restored or moved to another cluster; stop every relay of this schema, "+
		"run `oncekit outbox rebase` (outbox.Outbox.Rebase), then start the relays again "+
		"(docs/operations.md, \"Moving to another cluster\")", ErrClusterMoved, e.Partition, what, e.Next)
}

// Unwrap returns ErrClusterMoved.
func (e *ClusterMovedError) Unwrap() error { return ErrClusterMoved }

// movedSQL finds the first of the partitions $1 whose cursor, or whose
// newest row (one backward step of the index outbox_pending), carries a
// transaction ID at or after the snapshot's xmax: one the server has not
// assigned. On the cluster that wrote them, both are always below it.
const movedSQL = `WITH x AS (SELECT pg_snapshot_xmax(pg_current_snapshot()) AS xmax)
	SELECT p.partition, CASE WHEN p.cursor_txid >= x.xmax THEN p.cursor_txid::text ELSE '' END, CASE WHEN m.txid >= x.xmax THEN m.txid::text ELSE '' END, x.xmax::text
	FROM x, {schema}.relay_partitions p
	LEFT JOIN LATERAL (
		SELECT o.txid FROM {schema}.outbox o WHERE o.partition = p.partition
		ORDER BY o.txid DESC, o.seq DESC LIMIT 1) m ON true
	WHERE p.partition = ANY($1::int[]) AND (p.cursor_txid >= x.xmax OR m.txid >= x.xmax)
	ORDER BY p.partition LIMIT 1`

// checkMoved returns a *ClusterMovedError when one of parts is ahead of the
// server, nil when none is. It costs an index probe per partition: the relay
// runs it at start and when it acquires partitions, never per batch.
func (r *Relay) checkMoved(ctx context.Context, parts []int32) error {
	if len(parts) == 0 || skipMovedCheck.Load() {
		return nil
	}
	rows, err := r.pool.Query(ctx, pgsql.Render(movedSQL, r.ob.schema), parts)
	if err != nil {
		return fmt.Errorf("outbox: check the cursors against the server: %w", err)
	}
	defer rows.Close()
	var e *ClusterMovedError
	for rows.Next() {
		e = &ClusterMovedError{}
		if err := rows.Scan(&e.Partition, &e.Cursor, &e.Row, &e.Next); err != nil {
			return fmt.Errorf("outbox: check the cursors against the server: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: check the cursors against the server: %w", err)
	}
	if e == nil {
		return nil
	}
	return e
}

// skipMovedCheck turns the check off, for a test that shows what the relay
// did without it.
var skipMovedCheck atomic.Bool

// allPartitions lists the partitions 0 to n-1.
func allPartitions(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}

// stopMoved makes Run stop with err (a *ClusterMovedError) once the batches
// in flight are done.
func (r *Relay) stopMoved(err error) {
	if skipMovedCheck.Load() {
		return
	}
	r.log.Error("the outbox is ahead of this server; stopping", "err", err)
	if stop := r.fatal.Load(); stop != nil {
		(*stop)(err)
	}
}
