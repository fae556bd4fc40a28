package sideeffect_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/tracecontext"
)

// tupleStats reads side_effects' update counters. A backend reports its
// counts when it exits, so the caller closes the pool that did the updates
// first; the counts can still arrive a moment later.
func tupleStats(t *testing.T, b *bundle, wantUpdates int64) (updates, hot int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		err := b.db.Pool.QueryRow(context.Background(), `SELECT n_tup_upd, n_tup_hot_upd
			FROM pg_stat_user_tables WHERE relid = 'side_effects'::regclass`).Scan(&updates, &hot)
		return assert.NoError(t, err) && updates >= wantUpdates
	}, 15*time.Second, 20*time.Millisecond, "side_effects updates reported")
	return updates, hot
}

// A claim (pending -> fired) changes no indexed column and finds room on its
// row's page, so PostgreSQL makes it a HOT update: a new row version and no
// index entry. The confirm takes the row out of the due index and cannot be.
// The effects are recorded in a trace, so that they are in every index
// (side_effects_trace_id too).
func TestClaimsAreHOTUpdates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	const n = 600
	traced := tracecontext.ContextWith(context.Background(), tracecontext.Context{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	keys := b.recordIn(t, traced, "order.paid", n)
	var inTrace int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM side_effects WHERE trace IS NOT NULL`).Scan(&inTrace))
	require.Equal(t, n, inTrace)
	pool, err := pgxpool.New(context.Background(), b.db.URL)
	require.NoError(t, err)
	stop := runOn(t, pool, b.ledger, map[string]sideeffect.Provider{"order.paid": hook(rc, nil)}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, n, 20*time.Second)
	stop()
	pool.Close()
	rc.check(t, keys)

	updates, hot := tupleStats(t, b, 2*n)
	require.EqualValues(t, 2*n, updates, "one claim and one confirm per effect")
	// Not every claim finds room: a fired version carries the lease its
	// pending version did not, and a page of small rows fills up first.
	require.Greater(t, hot, int64(n/2), "most claims made as HOT updates")
	require.LessOrEqual(t, hot, int64(n), "confirms leave the due index: never HOT")
}

// Migration 007 moves settled rows out of the due index and unknown ones to
// 'infinity'; rows recorded before it are dispatched after it as before, and
// unknown ones are still counted.
func TestLedgerRowsSurviveTheHOTClaimMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDBAt(t, 6)
	l, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	b := &bundle{db: db, ledger: l}
	rc := newReceiver(t)
	// Recorded as a ledger of that release did: the current one also writes
	// the trace column of a later migration.
	keys := make([]string, 5)
	for i := range keys {
		src := fmt.Sprintf("src-hot-%d", i)
		keys[i] = oncekit.DeriveKey(src, "order.paid")
		_, err := db.Pool.Exec(ctx, `INSERT INTO side_effects (source_id, kind, payload, idempotency_key) VALUES ($1, 'order.paid', $2, $3)`,
			src, []byte(fmt.Sprintf(`{"n":%d}`, i)), keys[i])
		require.NoError(t, err)
	}
	set := func(key, sql string) {
		_, err := db.Pool.Exec(ctx, `UPDATE side_effects SET `+sql+` WHERE idempotency_key = $1`, key)
		require.NoError(t, err)
	}
	// keys[0] stays pending. keys[1] was fired by a dispatcher that died: its
	// lease, then its next_attempt_at, expired.
	set(keys[1], `state = 'fired', attempts = 1, lease_owner = 'dead', lease_expires_at = now() - interval '1 second',
		next_attempt_at = now() - interval '1 second', fired_at = now() - interval '1 minute'`)
	set(keys[2], `state = 'confirmed', attempts = 1, provider_ref = 'r0', confirmed_at = now()`)
	set(keys[3], `state = 'failed', attempts = 1, last_error = 'HTTP 422'`)
	set(keys[4], `state = 'unknown', attempts = 1, last_error = 'lease expired'`)

	_, err = migrations.Up(ctx, db.Pool, migrations.WithSchema(db.Schema))
	require.NoError(t, err)

	var def string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_indexdef('side_effects_due'::regclass)`).Scan(&def))
	require.Contains(t, def, "WHERE (next_attempt_at IS NOT NULL)")
	require.NotContains(t, def, "state")
	for i, want := range []string{"due", "due", "null", "null", "infinity"} {
		var got string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT CASE WHEN next_attempt_at IS NULL THEN 'null'
			WHEN next_attempt_at = 'infinity' THEN 'infinity' ELSE 'due' END
			FROM side_effects WHERE idempotency_key = $1`, keys[i]).Scan(&got))
		require.Equal(t, want, got, "effect %d", i)
	}

	reg := prometheus.NewRegistry()
	cfg := fastConfig(b)
	cfg.Registerer = reg
	start(t, b, map[string]sideeffect.Provider{"order.paid": hook(rc, nil)}, cfg)
	b.waitState(t, sideeffect.StateConfirmed, 3, 20*time.Second)
	rc.check(t, keys[:2])
	require.Equal(t, 2, b.rowByKey(t, keys[1]).Attempts, "fired again with its key")
	require.Eventually(t, func() bool {
		return metric(t, reg, "oncekit_sideeffect_unknown_effects", map[string]string{"kind": "order.paid"}) == 1
	}, 10*time.Second, 10*time.Millisecond)
	for i, k := range keys {
		r := b.rowByKey(t, k)
		if r.State == sideeffect.StatePending || r.State == sideeffect.StateFired {
			require.NotNil(t, r.NextAttemptAt, "effect %d", i)
		} else {
			require.Nil(t, r.NextAttemptAt, "effect %d is %s", i, r.State)
		}
	}
}
