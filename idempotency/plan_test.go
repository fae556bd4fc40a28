package idempotency

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// The operators' list and the unsettled gauges read the few records
// waiting for an outcome from their partial index, never by scanning the
// table of completed ones.
func TestUnsettledQueriesReadTheirIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code, expires_at)
		SELECT 't', 'pay', 'k' || g, '\x00', 'completed', 201, now() + interval '1 day' FROM generate_series(1, 20000) g;
		INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, unknown_reason, expires_at)
		SELECT 't', 'pay', 'u' || g, '\x00', 'unknown', 'lost', now() + interval '1 day' FROM generate_series(1, 3) g;
		ANALYZE idempotency_keys`)
	require.NoError(t, err)
	st := renderStatements(db.Schema)
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"unsettled gauges": {st.unsettled, nil},
		"operators' list":  {st.listUnknown, []any{"pay", 100}},
	} {
		rows, err := db.Pool.Query(ctx, "EXPLAIN "+q.sql, q.args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.Contains(t, plan, "idempotency_keys_unsettled", name+"\n"+plan)
		require.NotContains(t, plan, "Seq Scan", name+"\n"+plan)
	}
}
