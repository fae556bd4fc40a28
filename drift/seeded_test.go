package drift_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// effect inserts a side effect row and returns its ID.
func effect(t *testing.T, db *testenv.DB, source, kind, state, payload string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `INSERT INTO side_effects
		(source_id, kind, idempotency_key, state, payload, next_attempt_at, lease_expires_at)
		VALUES ($1, $2, $1 || $2, $3, convert_to($4, 'UTF8'),
			CASE $3 WHEN 'unknown' THEN 'infinity'::timestamptz WHEN 'confirmed' THEN NULL WHEN 'failed' THEN NULL ELSE now() END,
			CASE $3 WHEN 'fired' THEN now() - interval '1 hour' END)
		RETURNING id`, source, kind, state, payload).Scan(&id))
	return id
}

func ids(ns ...int64) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = strconv.FormatInt(n, 10)
	}
	return out
}

// paymentRules expect a capture (matched on the payload's payment_id) and a
// receipt (matched on source_id) per payment.
func paymentRules() []drift.Rule {
	return []drift.Rule{
		{Name: "payment_captures", Expect: &drift.Expectation{Kind: "capture", SourcesSQL: `SELECT id FROM payments;`, BusinessID: "$.payment_id"}},
		drift.ExpectEffects("payment_receipts", "receipt", `SELECT id FROM payments -- every payment`),
	}
}

func TestSeededDriftIsReportedOnceWithItsID(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	exec(t, db, `CREATE TABLE payments (id text PRIMARY KEY)`)
	exec(t, db, `INSERT INTO payments VALUES ('p1'), ('p2'), ('p3')`)
	// p1: clean. p2: no capture. p3: two captures under different source IDs.
	effect(t, db, "evt-1", "capture", "confirmed", `{"payment_id":"p1"}`)
	effect(t, db, "evt-3a", "capture", "confirmed", `{"payment_id":"p3"}`)
	effect(t, db, "evt-3b", "capture", "confirmed", `{"payment_id":"p3"}`)
	for _, p := range []string{"p1", "p2", "p3"} {
		effect(t, db, p, "receipt", "confirmed", `{}`)
	}
	fired := effect(t, db, "x1", "mail", "fired", `{}`)
	unknown := effect(t, db, "x2", "mail", "unknown", `{}`)
	failed := effect(t, db, "x3", "mail", "failed", `{}`)
	parked := uuid.New()
	exec(t, db, `INSERT INTO outbox (id, partition, ordering_key, subject, payload, parked_at) VALUES ($1, 0, 'acct-7', 'a.b', '', now())`, parked)
	var dead int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts)
		VALUES ('c', 'm', 's', '', 'poison', 5) RETURNING id`).Scan(&dead))

	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Rules: paymentRules()})
	require.NoError(t, err)
	rep, err := c.Run(context.Background())
	require.NoError(t, err)

	captures := finding(t, rep, "payment_captures")
	require.Equal(t, []string{"p2"}, captures.Missing)
	require.Equal(t, []string{"p3"}, captures.Extra)
	require.Equal(t, 2.0, captures.Value)
	require.Equal(t, []string{"missing p2", "extra p3: effects 2,3 for one business ID"}, captures.Examples)
	require.False(t, finding(t, rep, "payment_receipts").Drift, "receipts are matched on source_id and complete")

	for name, want := range map[string][]string{
		"effects_fired_past_lease": ids(fired),
		"effects_unknown":          ids(unknown),
		"effects_failed":           ids(failed),
		"outbox_parked":            {parked.String()},
		"dead_letters":             ids(dead),
	} {
		f := finding(t, rep, name)
		require.Equal(t, want, f.IDs, name)
		require.Equal(t, 1.0, f.Value, name)
		require.True(t, f.Drift, name)
	}
	var drifted []string
	for _, f := range rep.Findings {
		if f.Drift {
			drifted = append(drifted, f.Check)
		}
	}
	require.ElementsMatch(t, []string{"payment_captures", "effects_fired_past_lease", "effects_unknown",
		"effects_failed", "outbox_parked", "dead_letters"}, drifted, "nothing else is drift, nothing twice")

	var buf bytes.Buffer
	require.NoError(t, rep.WriteJSON(&buf))
	var out struct {
		Drifted  bool             `json:"drifted"`
		Findings []map[string]any `json:"findings"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &out))
	require.True(t, out.Drifted)
	for _, f := range out.Findings {
		if f["check"] == "payment_captures" {
			require.Equal(t, []any{"p2"}, f["missing"])
			require.Equal(t, []any{"p3"}, f["extra"])
		}
	}
}

func TestCleanDatabaseHasNoFindings(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	exec(t, db, `CREATE TABLE payments (id text PRIMARY KEY)`)
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Rules: paymentRules(),
		Horizons: []drift.Horizon{{Consumer: "payments", Horizon: time.Hour}}})
	require.NoError(t, err)
	rep, err := c.Run(context.Background())
	require.NoError(t, err)
	for _, f := range rep.Findings {
		require.False(t, f.Drift || f.Failed(), "%+v", f)
		require.Empty(t, f.Examples, f.Check)
	}
}

func TestSlowCheckIsReportedAndTheOthersRun(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	exec(t, db, `INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts) VALUES ('c', 'm', 's', '', 'poison', 5)`)
	// The timeout cuts the slow check and leaves the others (a first
	// statement each, on a cold connection of a loaded machine) time to run.
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, CheckTimeout: 3 * time.Second,
		Rules: []drift.Rule{{Name: "slow", SQL: `SELECT 1 FROM pg_sleep(30)`}}})
	require.NoError(t, err)
	start := time.Now()
	rep, err := c.Run(context.Background())
	require.Less(t, time.Since(start), 20*time.Second, "the slow check was cut off")
	require.ErrorIs(t, err, drift.ErrCheckFailed)
	slow := finding(t, rep, "slow")
	require.Contains(t, slow.Error, "timed out after 3s")
	require.True(t, rep.Failed())
	require.True(t, finding(t, rep, "dead_letters").Drift, "the other checks still ran")
	for _, f := range rep.Findings {
		if f.Check != "slow" {
			require.False(t, f.Failed(), "%+v", f)
		}
	}
	var buf bytes.Buffer
	require.NoError(t, rep.WriteTable(&buf))
	require.Contains(t, buf.String(), "slow: could not run: timed out after 3s")
}

func TestRuleErrorsPointIntoTheRulesSQL(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Rules: []drift.Rule{
		{Name: "typo", SQL: `SELEC 1`},
		{Name: "semicolon", SQL: "SELECT 1 WHERE false;\n"},
		{Name: "comment", SQL: `SELECT 1 WHERE false -- nothing`},
		{Name: "later", SQL: `SELECT 1 FROM nowhere_at_all`},
		{Name: "expect_typo", Expect: &drift.Expectation{Kind: "k", SourcesSQL: `SELECT id FROM`}},
	}})
	require.NoError(t, err)
	rep, _ := c.Run(context.Background())
	typo := finding(t, rep, "typo")
	require.Contains(t, typo.Error, `rule typo: syntax error at or near "1"`)
	require.Contains(t, typo.Error, "at character 7 of the rule's SQL")
	require.NotContains(t, typo.Error, "OVER")
	require.False(t, finding(t, rep, "semicolon").Failed(), finding(t, rep, "semicolon").Error)
	require.False(t, finding(t, rep, "comment").Failed(), finding(t, rep, "comment").Error)
	require.Contains(t, finding(t, rep, "later").Error, "at character 15 of the rule's SQL")
	require.Contains(t, finding(t, rep, "expect_typo").Error, "rule expect_typo: syntax error")
}

func TestRetentionShorterThanTheHorizonIsDrift(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	exec(t, db, `INSERT INTO processed_messages (consumer, message_id, processed_at) VALUES
		('short', gen_random_uuid(), now()),
		('kept', gen_random_uuid(), now()), ('kept', gen_random_uuid(), now() - interval '8 days'),
		('young', gen_random_uuid(), now())`)
	week := 7 * 24 * time.Hour
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Horizons: []drift.Horizon{
		{Consumer: "short", Horizon: week}, {Consumer: "kept", Horizon: week}, {Consumer: "idle", Horizon: week},
		{Consumer: "young", Horizon: week, Since: time.Now().Add(-time.Hour)},
	}})
	require.NoError(t, err)
	rep, err := c.Run(context.Background())
	require.NoError(t, err)
	f := finding(t, rep, "processed_messages_retention")
	require.Equal(t, 1.0, f.Value)
	require.Len(t, f.Examples, 1)
	require.True(t, strings.HasPrefix(f.Examples[0], "consumer short keeps no claim older than its horizon"), f.Examples[0])
}

func TestWindowBoundsExpectations(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	exec(t, db, `CREATE TABLE payments (id text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())`)
	exec(t, db, `INSERT INTO payments VALUES ('old', now() - interval '3 days'), ('new', now())`)
	effect(t, db, "new", "receipt", "confirmed", `{}`)
	// An old payment without its receipt, and an old receipt without its
	// payment: outside a one-day window, neither is looked at.
	exec(t, db, `INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at, created_at)
		VALUES ('gone', 'receipt', 'k-gone', 'confirmed', NULL, now() - interval '3 days')`)
	rule := drift.ExpectEffects("receipts", "receipt", `SELECT id FROM payments WHERE created_at >= {since}`)
	run := func(window time.Duration) drift.Finding {
		c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Window: window, Rules: []drift.Rule{rule}})
		require.NoError(t, err)
		rep, err := c.Run(context.Background())
		require.NoError(t, err)
		return finding(t, rep, "receipts")
	}
	require.False(t, run(24*time.Hour).Drift)
	all := run(0)
	require.Equal(t, []string{"old"}, all.Missing)
	require.Equal(t, []string{"gone"}, all.Extra)
}

func TestReadRules(t *testing.T) {
	t.Parallel()
	cfg := drift.Config{Rules: []drift.Rule{{Name: "from_go", SQL: "SELECT 1"}}}
	err := drift.ReadRules(strings.NewReader(`
max_outbox_age: 90s
check_timeout: 5s
slot: oncekit_app
max_slot_lag_bytes: 5000000
max_inactive_slot_retained_bytes: 2000000
skip: [effects_failed]
window: 24h
rules:
  - name: custom
    sql: SELECT id FROM orders WHERE false
  - name: captures
    expect:
      kind: capture
      sources: SELECT id FROM payments
      business_id: $.payment.id
horizons:
  - consumer: payments
    horizon: 168h
`), &cfg)
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, cfg.MaxOutboxAge)
	require.Equal(t, 5*time.Second, cfg.CheckTimeout)
	require.Equal(t, "oncekit_app", cfg.Slot)
	require.Equal(t, int64(5_000_000), cfg.MaxSlotLagBytes)
	require.Equal(t, int64(2_000_000), cfg.MaxInactiveSlotRetainedBytes)
	require.Equal(t, 24*time.Hour, cfg.Window)
	require.Equal(t, []string{"effects_failed"}, cfg.Skip)
	require.Len(t, cfg.Rules, 3)
	require.Equal(t, "$.payment.id", cfg.Rules[2].Expect.BusinessID)
	require.Equal(t, []drift.Horizon{{Consumer: "payments", Horizon: 168 * time.Hour}}, cfg.Horizons)

	for _, bad := range []string{
		"max_outbox_age: -5s",
		"max_outbox_ag: 5s",
		"max_slot_lag_bytes: -1",
		"rules:\n  - name: x\n    sql: SELECT 1\n    expect: {kind: k, sources: SELECT 1}",
		"rules:\n  - name: Bad Name\n    sql: SELECT 1",
		"rules:\n  - name: x\n    expect: {kind: k, sources: SELECT 1, business_id: 'payment id'}",
		"horizons:\n  - consumer: c",
		"rules: [",
	} {
		var cfg drift.Config
		err := drift.ReadRules(strings.NewReader(bad), &cfg)
		require.ErrorIs(t, err, drift.ErrInvalidRules, bad)
	}
}

func TestCheckersShareARegisterer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	reg := prometheus.NewRegistry()
	for range 2 {
		c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Registerer: reg})
		require.NoError(t, err)
		_, err = c.Run(context.Background())
		require.NoError(t, err)
	}
	require.Equal(t, 2.0, testenv.Metric(t, reg, "oncekit_drift_runs_total"), "the second checker counts in the same series")
}

func TestSkipLeavesOutABuiltInCheck(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effect(t, db, "x", "mail", "failed", `{}`)
	c, err := drift.New(db.Pool, &drift.Config{Schema: db.Schema, Logger: quiet, Skip: []string{"effects_failed"}})
	require.NoError(t, err)
	rep, err := c.Run(context.Background())
	require.NoError(t, err)
	require.False(t, rep.Drifted(), "%+v", rep.Findings)
	for _, f := range rep.Findings {
		require.NotEqual(t, "effects_failed", f.Check)
	}
	_, err = drift.New(db.Pool, &drift.Config{Schema: db.Schema, Skip: []string{"effects_faild"}})
	require.ErrorIs(t, err, drift.ErrInvalidConfig)
}
