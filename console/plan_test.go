package console

import (
	"context"
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
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
	// The pages' reads, each run on a traced pool: the owners' methods the
	// console composes, and its own audit statements.
	var log testenv.StatementLog
	pool := db.TracedPool(t, &log)
	con, err := New(pool, &Config{Schema: db.Schema})
	require.NoError(t, err)
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	texts := []string{"a", "b"}
	ref := idempotency.Ref{Tenant: "t1", Operation: "pay", StoredKey: "k"}
	ignore := func(_ any, err error) error { return err }
	query := func(rows pgx.Rows, err error) error {
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	for name, read := range map[string]func() error{
		"inbox: dead letter groups": func() error { return ignore(con.store.DeadLetterGroups(ctx, pool, 50)) },
		"inbox: a group's letters": func() error {
			return ignore(con.store.DeadLettersInGroup(ctx, pool, "c", "0123456789abcdef", 1000))
		},
		"effects: overdue":        func() error { return ignore(con.ledger.MostOverdue(ctx, pool, 300*time.Second, 50)) },
		"effects: unknown":        func() error { return ignore(con.ledger.UnknownAfter(ctx, pool, 0, 50)) },
		"effects: unknown, older": func() error { return ignore(con.ledger.UnknownAfter(ctx, pool, 1000, 50)) },
		"audit":                   func() error { return query(pool.Query(ctx, con.sql.audit, int64(math.MaxInt64), 50)) },
		"audit, older":            func() error { return query(pool.Query(ctx, con.sql.audit, int64(n/2), 50)) },
		"chain: edge": func() error {
			if _, err := con.records.Get(ctx, pool, ref); !errors.Is(err, idempotency.ErrRecordNotFound) {
				return err
			}
			return nil
		},
		"chain: outbox":       func() error { return ignore(con.ob.Events(ctx, pool, ids, 100)) },
		"chain: claims":       func() error { return ignore(con.store.Claims(ctx, pool, ids, 100)) },
		"chain: dead letters": func() error { return ignore(con.store.DeadLettersOf(ctx, pool, texts, 100)) },
		"chain: effects":      func() error { return ignore(con.ledger.Related(ctx, pool, texts, "k", 100)) },
		"chain: a trace, effects": func() error {
			return ignore(con.ledger.SourcesInTrace(ctx, pool, "c4ca4238a0b923820dcc509a6f75849b", 20))
		},
		"chain: a trace, dead letters": func() error {
			return ignore(con.store.MessagesInTrace(ctx, pool, "c4ca4238a0b923820dcc509a6f75849b", 20))
		},
	} {
		before := len(log.Matching(""))
		require.NoError(t, read(), name)
		stmts := log.Matching("")[before:]
		require.Len(t, stmts, 1, name)
		q := stmts[0]
		plan := testenv.GenericPlan(t, db.Pool, q.SQL, q.Args...)
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
