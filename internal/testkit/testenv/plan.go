package testenv

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// GenericPlan runs sql with args under EXPLAIN (ANALYZE, COSTS OFF) with a
// generic plan, as pgx runs a statement once prepared and PostgreSQL has
// settled on one, and JIT off, and returns the plan's text.
func GenericPlan(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	RequireDirect(t, "a plan test reads the generic plan of a statement pgx prepares, which it does not prepare through a pooler")
	ctx := context.Background()
	var lines []string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL jit = off"); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+sql, args...)
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	}), sql)
	return strings.Join(lines, "\n")
}

// filtered finds the rows a plan node read and threw away.
var filtered = regexp.MustCompile(`Rows Removed by Filter: (\d+)`)

// RequireIndexReads fails unless plan (of the statement named what) reads
// none of the tables large whole, and throws away fewer than 1,000 rows it
// read in any node: a read far beyond what it returns is a scan too. A
// scan the plan holds but never ran reads nothing.
func RequireIndexReads(t testing.TB, what, plan string, large ...string) {
	t.Helper()
	for _, line := range strings.Split(plan, "\n") {
		for _, table := range large {
			if strings.Contains(line, "Seq Scan on "+table+" ") && !strings.Contains(line, "(never executed)") {
				require.Fail(t, what+" reads "+table+" whole", plan)
			}
		}
	}
	for _, m := range filtered.FindAllStringSubmatch(plan, -1) {
		n, _ := strconv.Atoi(m[1])
		require.Less(t, n, 1000, what+"\n"+plan)
	}
}
