package retention

import (
	"context"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// PruneInTIDOrder runs one retention pass over the rows of a table that
// only a BRIN index finds (processed_messages, side_effects), in the
// table's physical order, and returns how many rows it deleted.
//
// bounds returns the first and the last tuple id of the rows past retention
// (min(ctid), max(ctid); NULLs when there are none), from args. batch looks
// at up to size of them after a tuple id and up to another, deletes those
// still to be deleted, and returns how many it looked at, how many it
// deleted and the last one's tuple id (a batch whose pass lock another pass
// holds looks at none); it takes args, then the two tuple ids and size. Each
// batch starts where the previous one ended: a TID range
// scan reads the pages of its own rows only. A batch that started at the
// first page (through the BRIN index or a sequential scan) instead read
// every page the pass had emptied so far (deleted rows stay until vacuum,
// and a BRIN summary never shrinks), which made a pass quadratic in the rows
// it deleted (decision 018). The pass ends at the first batch
// that looks at fewer than size rows, or when ctx ends.
func PruneInTIDOrder(ctx context.Context, q oncekit.Querier, bounds, batch string, args []any, size int) (int64, error) {
	var first, last pgtype.TID
	if err := pgsql.QueryRowNoJIT(ctx, q, bounds, args, &first, &last); err != nil || !last.Valid {
		return 0, err
	}
	// Offsets start at 1, so (page, offset-1) is just before the first row.
	after := pgtype.TID{BlockNumber: first.BlockNumber, OffsetNumber: first.OffsetNumber - 1, Valid: true}
	args = args[:len(args):len(args)]
	var total int64
	for ctx.Err() == nil {
		var looked, deleted int64
		var end pgtype.TID
		if err := q.QueryRow(ctx, batch, append(args, after, last, size)...).Scan(&looked, &deleted, &end); err != nil {
			return total, err
		}
		total += deleted
		if looked < int64(size) {
			return total, nil
		}
		after = end
	}
	return total, ctx.Err()
}
