package console

import (
	"context"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testenv"
)

var rechecked = regexp.MustCompile(`Rows Removed by Index Recheck: (\d+)`)

// Every query of the console's pages reads through an index: on tables of
// some size (and their statistics), none scans a whole table. A page then
// costs the same on a year of history as on an empty database. (The
// partitions' table, a row per partition, may be read whole.)
func TestPagesReadThroughIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	const n = 20000
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code, expires_at)
			SELECT 't' || (g % 50), 'pay', md5(g::text), '\x00', 'completed', 201, now() + interval '1 day' FROM generate_series(1, 20000) g;
		INSERT INTO outbox (id, partition, ordering_key, subject, payload)
			SELECT gen_random_uuid(), g % 8, 'k' || (g % 500), 'a.b', '' FROM generate_series(1, 20000) g;
		INSERT INTO processed_messages (consumer, message_id) SELECT 'c' || (g % 3), gen_random_uuid() FROM generate_series(1, 20000) g;
		INSERT INTO dead_letters (consumer, message_id, subject, payload, headers, reason, attempts, replayed_at)
			SELECT 'c', gen_random_uuid()::text, 'a.b', '', jsonb_build_object('traceparent', jsonb_build_array('00-' || md5(g::text) || '-00f067aa0ba902b7-01')),
				'err ' || g, 5, now() FROM generate_series(1, 20000) g;
		INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at, trace)
			SELECT 's' || g, 'mail', md5('e' || g), CASE WHEN g % 10 = 7 THEN 'unknown' ELSE 'confirmed' END,
				CASE WHEN g % 10 = 7 THEN 'infinity'::timestamptz END,
				CASE WHEN g % 2 = 0 THEN jsonb_build_object('traceparent', '00-' || md5(g::text) || '-00f067aa0ba902b7-01') END
			FROM generate_series(1, 20000) g;
		INSERT INTO console_audit (operator, action, target, count) SELECT 'a', 'x', 'y', 1 FROM generate_series(1, 20000) g;
		ANALYZE`)
	require.NoError(t, err)
	st := renderStatements(db.Schema)
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"inbox: dead letter groups": {st.deadGroups, []any{50}},
		"inbox: a group's letters":  {st.deadInGroup, []any{"c", "0123456789abcdef", 1000}},
		"effects: overdue":          {st.overdue, []any{300.0, 50}},
		"effects: unknown":          {st.unknownEffects, []any{int64(0), 50}},
		"effects: unknown, older":   {st.unknownEffects, []any{int64(1000), 50}},
		"audit":                     {st.audit, []any{int64(math.MaxInt64), 50}},
		"audit, older":              {st.audit, []any{int64(n / 2), 50}},
		"chain: edge":               {st.chainEdge, []any{"t1", "pay", "k"}},
		"chain: outbox":             {st.chainOutbox, []any{ids}},
		"chain: claims":             {st.chainClaims, []any{ids}},
		"chain: dead letters":       {st.chainDead, []any{[]string{"a", "b"}}},
		"chain: effects":            {st.chainEffects, []any{[]string{"a", "b"}, "k"}},
		"chain: a trace":            {st.chainTrace, []any{"c4ca4238a0b923820dcc509a6f75849b"}},
		"edge: a record":            {st.edgeRecord, []any{"t1", "pay", "k"}},
	} {
		plan := testenv.GenericPlan(t, db.Pool, q.sql, q.args...)
		// relay_partitions, a row a partition, may be read whole.
		testenv.RequireIndexReads(t, name, plan, "outbox", "processed_messages", "dead_letters", "side_effects", "idempotency_keys", "console_audit")
		// A page of the 2,000 unknown effects reads a page's worth of them,
		// in the index's order, not all of them to sort.
		if strings.HasPrefix(name, "effects: unknown") {
			require.NotContains(t, plan, "Sort", name+"\n"+plan)
		}
		// A bitmap read far beyond what the page shows is a scan too.
		for _, m := range rechecked.FindAllStringSubmatch(plan, -1) {
			n, _ := strconv.Atoi(m[1])
			require.Less(t, n, 1000, name+"\n"+plan)
		}
	}
}
