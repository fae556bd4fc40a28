package sideeffect

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// The claim reads the due index in its order and stops at its LIMIT, even on
// a table PostgreSQL has no statistics for yet, where the planner guesses
// that few of the index's rows are pending and would rather read and sort
// all of them. The dispatcher's settings (genericPlan) rule the sort out.
func TestClaimReadsTheDueIndexInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO side_effects (source_id, kind, idempotency_key)
		SELECT 'order-' || g, 'order.paid', 'key-' || g FROM generate_series(1, 5000) g`)
	require.NoError(t, err)
	st := render(db.Schema)

	plan := func(settings string) string {
		var out []string
		require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if settings != "" {
				if _, err := tx.Exec(ctx, settings); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, "PREPARE claim_plan AS "+st.sync); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `EXPLAIN EXECUTE claim_plan('me', '30 seconds', '{order.paid}', 32,
				'{}', '{}', '{}', '{}', '{}', '{}')`, pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				return err
			}
			out, err = pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "DEALLOCATE claim_plan")
			return err
		}))
		return strings.Join(out, "\n")
	}

	p := plan(genericPlan)
	require.Contains(t, p, "Index Scan using side_effects_due", p)
	require.NotContains(t, p, "Sort", p)
	require.NotContains(t, p, "Seq Scan", p)
}
