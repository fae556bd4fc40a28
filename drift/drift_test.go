package drift_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/internal/cfgerr/cfgerrtest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func finding(t *testing.T, r drift.Report, name string) drift.Finding {
	t.Helper()
	for _, f := range r.Findings {
		if f.Check == name {
			return f
		}
	}
	t.Fatalf("no finding %q in %+v", name, r.Findings)
	return drift.Finding{}
}

func exec(t *testing.T, db *testenv.DB, sql string, args ...any) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

func TestCleanChainHasNoDrift(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	// A published message: behind its partition's cursor.
	exec(t, db, `INSERT INTO outbox (id, partition, subject, payload, created_at) VALUES ($1, 0, 'a.b', '', now() - interval '2 hours')`, uuid.New())
	exec(t, db, `DELETE FROM relay_partitions; -- the test states the partitions
INSERT INTO relay_partitions (partition, cursor_txid, cursor_seq) SELECT partition, txid, seq FROM outbox`)
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state) VALUES ('o1', 'email', 'k1', 'confirmed')`)
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state, lease_expires_at) VALUES ('o2', 'email', 'k2', 'fired', now() + interval '1 minute')`)
	exec(t, db, `CREATE TABLE orders (id text PRIMARY KEY)`)
	exec(t, db, `INSERT INTO orders VALUES ('o1'), ('o2')`)

	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Rules: []drift.Rule{
		drift.ExpectEffects("order_receipts", "email", `SELECT id FROM orders`),
	}})
	require.NoError(t, err)
	rep, err := c.Run(context.Background())
	require.NoError(t, err)
	require.False(t, rep.Drifted(), "%+v", rep.Findings)
	require.False(t, rep.Failed(), "%+v", rep.Findings)
	require.Len(t, rep.Findings, 13)
}

func TestEveryKindOfDriftIsFound(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	// Outbox: an old unpublished row and a parked one.
	exec(t, db, `INSERT INTO outbox (id, partition, subject, payload, created_at) VALUES ($1, 0, 'a.b', '', now() - interval '2 hours')`, uuid.New())
	exec(t, db, `INSERT INTO outbox (id, partition, subject, payload, parked_at) VALUES ($1, 0, 'a.b', '', now())`, uuid.New())
	// Side effects: fired past its lease, unknown, pending long overdue.
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state, lease_expires_at) VALUES ('o1', 'email', 'k1', 'fired', now() - interval '1 hour')`)
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state) VALUES ('o2', 'email', 'k2', 'unknown')`)
	exec(t, db, `UPDATE side_effects SET next_attempt_at = 'infinity' WHERE state = 'unknown'`)
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at) VALUES ('o9', 'email', 'k9', 'pending', now() - interval '1 hour')`)
	// An HTTP request in progress long past its lease.
	exec(t, db, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, locked_until, expires_at)
		VALUES ('t', 'op', 'k', '\x00', 'in_progress', now() - interval '1 hour', now() + interval '1 day')`)
	// An HTTP request whose outcome is unknown.
	exec(t, db, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, unknown_reason, expires_at)
		VALUES ('t', 'op', 'u', '\x00', 'unknown', 'charge: EOF', now() + interval '1 day')`)
	// A dead letter.
	exec(t, db, `INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts) VALUES ('c', 'm', 's', '', 'poison', 5)`)
	// Orders o1, o2, o3: o3 has no receipt; o9's receipt has no order.
	exec(t, db, `CREATE TABLE orders (id text PRIMARY KEY)`)
	exec(t, db, `INSERT INTO orders VALUES ('o1'), ('o2'), ('o3')`)

	reg := prometheus.NewRegistry()
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Registerer: reg, Logger: quiet, Rules: []drift.Rule{
		drift.ExpectEffects("order_receipts", "email", `SELECT id FROM orders`),
		{Name: "custom_none", SQL: `SELECT id FROM orders WHERE id = 'nope'`},
	}})
	require.NoError(t, err)
	rep, err := c.Run(context.Background())
	require.NoError(t, err)
	require.True(t, rep.Drifted())

	for name, want := range map[string]float64{
		"outbox_parked": 1, "effects_fired_past_lease": 1, "effects_unknown": 1,
		"effects_pending_overdue": 1, "idempotency_in_progress_past_lease": 1, "idempotency_unknown": 1, "dead_letters": 1, "order_receipts": 2,
	} {
		f := finding(t, rep, name)
		require.Equal(t, want, f.Value, name)
		require.True(t, f.Drift, name)
	}
	backlog := finding(t, rep, "outbox_backlog")
	require.Equal(t, 1.0, backlog.Value)
	require.False(t, backlog.Drift, "one row is within the default backlog limit")
	age := finding(t, rep, "outbox_oldest_age_seconds")
	require.True(t, age.Drift)
	require.InDelta(t, (2 * time.Hour).Seconds(), age.Value, 60)
	require.False(t, finding(t, rep, "custom_none").Drift)
	require.ElementsMatch(t, []string{"missing o3", "extra o9: effect 3 without a source"}, finding(t, rep, "order_receipts").Examples)

	require.Equal(t, 1.0, gauge(t, reg, "oncekit_drift_findings", "effects_unknown"))
	require.Equal(t, 2.0, gauge(t, reg, "oncekit_drift_value", "order_receipts"))

	var buf bytes.Buffer
	require.NoError(t, rep.WriteTable(&buf))
	require.Contains(t, buf.String(), "effects_unknown")
	require.Contains(t, buf.String(), "DRIFT")
	require.Contains(t, buf.String(), "order_receipts: missing o3")
}

func gauge(t *testing.T, reg *prometheus.Registry, name, check string) float64 {
	t.Helper()
	return testenv.Metric(t, reg, name, "check", check)
}

func TestBrokenRuleIsAnError(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Rules: []drift.Rule{{Name: "bad", SQL: "SELECT nope FROM nowhere"}}})
	require.NoError(t, err)
	rep, err := c.Run(context.Background())
	require.ErrorIs(t, err, drift.ErrCheckFailed)
	require.ErrorContains(t, err, "check bad")
	require.True(t, finding(t, rep, "bad").Failed())
	require.False(t, finding(t, rep, "dead_letters").Failed(), "the other checks ran")
}

func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field  string
		cfg    drift.Config
		detail string // what follows the field in the error, when pinned
	}{
		{"Schema", drift.Config{Schema: "Bad Schema"}, ""},
		{"MaxOutboxAge", drift.Config{MaxOutboxAge: -1}, "-1ns is negative"},
		{"MaxPendingAge", drift.Config{MaxPendingAge: -1}, "-1ns is negative"},
		{"LeaseGrace", drift.Config{LeaseGrace: -1}, "-1ns is negative"},
		{"FailedWindow", drift.Config{FailedWindow: -1}, "-1ns is negative"},
		{"Window", drift.Config{Window: -1}, "-1ns is negative"},
		{"CheckTimeout", drift.Config{CheckTimeout: -1}, "-1ns is negative"},
		{"MaxOutboxBacklog", drift.Config{MaxOutboxBacklog: -1}, "-1 is negative"},
		{"Concurrency", drift.Config{Concurrency: -1}, "-1 is negative"},
		{"MaxIDs", drift.Config{MaxIDs: -1}, "-1 is negative"},
		{"Skip", drift.Config{Skip: []string{"effects_faild"}}, ""},
		{"Rules[0]", drift.Config{Rules: []drift.Rule{{Name: "Has Space", SQL: "SELECT 1"}}}, ""},
		{"Rules[1].Name", drift.Config{Rules: []drift.Rule{{Name: "a", SQL: "SELECT 1"}, {Name: "a", SQL: "SELECT 1"}}}, ""},
		{"Rules[0].Name", drift.Config{Rules: []drift.Rule{{Name: "dead_letters", SQL: "SELECT 1"}}}, ""},
		{"Rules[0]", drift.Config{Rules: []drift.Rule{{Name: "a"}}}, ""},
		{"Horizons[0]", drift.Config{Horizons: []drift.Horizon{{Consumer: "c"}}}, ""},
	} {
		_, err := drift.New(nil, &tc.cfg)
		cfgerrtest.RequireField(t, err, drift.ErrInvalidConfig, "drift: Config."+tc.field, tc.detail)
	}
}

// Every check, rules included, runs in a READ ONLY transaction that is
// rolled back: a rule that writes (a row, a sequence, which no rollback
// undoes) fails as a check instead of changing the database, what it could
// do all the same (a large object) is rolled back, and the other checks run.
func TestRulesRunReadOnly(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE SEQUENCE drift_probe; CREATE TABLE drift_written (v int);
		CREATE FUNCTION drift_write() RETURNS int LANGUAGE sql AS 'INSERT INTO drift_written VALUES (1) RETURNING v'`)
	require.NoError(t, err)
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Rules: []drift.Rule{
		{Name: "insert", SQL: `SELECT 'wrote ' || drift_write()`},
		{Name: "sequence", SQL: `SELECT 'n ' || nextval('drift_probe')`},
		{Name: "large_object", SQL: `SELECT 'made ' || lo_create(0)`},
	}})
	require.NoError(t, err)
	// Large objects belong to the database, not the test's schema: the
	// rule's would show as a difference.
	var before int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&before))
	rep, err := c.Run(ctx)
	require.ErrorIs(t, err, drift.ErrCheckFailed)
	for _, name := range []string{"insert", "sequence"} {
		require.Contains(t, finding(t, rep, name).Error, "read-only transaction", name)
	}
	require.False(t, finding(t, rep, "dead_letters").Failed(), "the other checks ran")
	var rows, objects int
	var called bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM drift_written), (SELECT is_called FROM drift_probe),
		(SELECT count(*) FROM pg_largeobject_metadata)`).Scan(&rows, &called, &objects))
	require.Zero(t, rows, "no row was written")
	require.False(t, called, "the sequence did not move")
	require.Equal(t, before, objects, "no large object was left")
}
