package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/report"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// seedStatus fills db with one of everything `oncekit status` shows. Ages
// are whole minutes or more from the largest unit down, so that the
// seconds a slow machine takes never change what is printed.
func seedStatus(t *testing.T, db *testenv.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		DELETE FROM relay_partitions; -- the test states the partitions

		INSERT INTO relay_partitions (partition, owner, token, expires_at) VALUES
			(0, 'relay-a', 1, now() + interval '90 seconds'), (1, 'relay-a', 1, now() + interval '90 seconds'),
			(2, 'relay-b', 1, now() - interval '10 minutes'), (3, NULL, 0, '-infinity');
		INSERT INTO relay_nodes (id, heartbeat_at) VALUES ('relay-a', now() - interval '2 minutes');
		INSERT INTO outbox (id, partition, ordering_key, subject, payload, created_at) VALUES
			('00000000-0000-0000-0000-000000000001', 0, 'acct-1', 'orders.created', '', now() - interval '2 hours'),
			('00000000-0000-0000-0000-000000000002', 1, 'acct-2', 'orders.created', '', now() - interval '5 minutes'),
			('00000000-0000-0000-0000-000000000003', 3, 'acct-3', 'orders.created', '', now() - interval '30 minutes');
		INSERT INTO outbox (id, partition, ordering_key, subject, payload, attempts, parked_at, next_attempt_at, last_error) VALUES
			('00000000-0000-0000-0000-000000000004', 2, 'acct-7', 'orders.created', '', 10, now() - interval '2 hours', now(), 'no stream');
		INSERT INTO processed_messages (consumer, message_id, processed_at) VALUES
			('payments', gen_random_uuid(), now() - interval '10 minutes'),
			('payments', gen_random_uuid(), now() - interval '20 minutes'),
			('emails', gen_random_uuid(), now() - interval '3 hours');
		INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts, created_at) VALUES
			('emails', 'm1', 'orders.created', '', 'poison', 25, now() - interval '26 hours');
		INSERT INTO side_effects (source_id, kind, idempotency_key, state, next_attempt_at, lease_expires_at) VALUES
			('p1', 'capture', 'k1', 'pending', now() + interval '1 minute', NULL),
			('p2', 'capture', 'k2', 'pending', now() - interval '1 hour', NULL),
			('p3', 'capture', 'k3', 'fired', now() - interval '1 hour', now() - interval '30 minutes'),
			('p4', 'capture', 'k4', 'unknown', 'infinity', NULL),
			('p5', 'capture', 'k5', 'confirmed', NULL, NULL),
			('p1', 'receipt', 'k6', 'confirmed', NULL, NULL),
			('p2', 'receipt', 'k7', 'failed', NULL, NULL);
		INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, locked_until, expires_at, status_code) VALUES
			('t', 'pay', 'a', '\x00', 'in_progress', now() - interval '1 hour', now() + interval '1 day', NULL),
			('t', 'pay', 'b', '\x00', 'in_progress', now() + interval '1 minute', now() + interval '1 day', NULL),
			('t', 'pay', 'c', '\x00', 'completed', NULL, now() + interval '1 day', 201),
			('t', 'pay', 'd', '\x00', 'unknown', NULL, now() + interval '1 day', NULL)`)
	require.NoError(t, err)
}

func TestStatusMatchesGolden(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	seedStatus(t, db)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE oncekit_inbox_processed_total counter\noncekit_inbox_processed_total{consumer=\"payments\"} 1234\n"+
			"# TYPE oncekit_inbox_duplicates_total counter\noncekit_inbox_duplicates_total{consumer=\"payments\"} 7\n")
	}))
	defer metrics.Close()

	code, out, stderr := cli(t, dbVars(db), "status", "--metrics", metrics.URL+"/metrics")
	require.Equal(t, 0, code, stderr)
	out = strings.ReplaceAll(out, db.Schema, "SCHEMA")
	golden := filepath.Join("testdata", "status.golden")
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(out), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), out)

	code, out, stderr = cli(t, dbVars(db), "status", "--json")
	require.Equal(t, 0, code, stderr)
	var rep report.Status
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, int64(3), rep.Outbox.Backlog)
	require.Equal(t, int64(1), rep.Outbox.Parked)
	require.Len(t, rep.Outbox.Ranges, 3)
	require.Equal(t, "acct-7", rep.Outbox.ParkedKeys[0].Key)
	require.Len(t, rep.Consumers, 2)
	require.Nil(t, rep.Consumers[0].Processed, "no --metrics: no counters")
	require.Equal(t, int64(1), rep.Effects[0].Unknown)
	require.Equal(t, int64(1), rep.Idempotency.InProgressPastLease)
	require.Contains(t, out, `"partition_ranges"`)
}

func TestStatusOnAnEmptyDatabase(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	code, out, stderr := cli(t, dbVars(db), "status")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `0-15 +- +free`, out, "the migrations' 16 partitions, none leased")
	require.Contains(t, out, "relays: none")
	code, out, stderr = cli(t, dbVars(db), "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"consumers": []`)
	require.Regexp(t, `"first": 0,\s+"last": 15,`, out)
}

func TestStatusSaysWhenEffectsWereCountedUpToTheCap(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	rep := report.Status{Effects: []report.Effects{{Kind: "capture", Pending: report.LiveCap}}}
	require.NoError(t, writeStatus(&env{stdout: &out}, rep))
	require.NotContains(t, out.String(), "at least")
	rep.EffectsCapped = true
	out.Reset()
	require.NoError(t, writeStatus(&env{stdout: &out}, rep))
	require.Contains(t, out.String(), "effects counted up to 10000 due, 10000 unknown and the newest 10000 recorded: each figure is at least what it says")
}

// In logical mode a slot that stopped moving is shown behind, inactive and
// keeping WAL, though the outbox table is empty; without logical mode no
// slot line is printed.
func TestStatusShowsTheLogicalSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	code, out, stderr := cli(t, dbVars(db), "status")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, out, "logical mode")
	require.NotContains(t, out, "WAL messages")

	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, ob.SetUpLogical(ctx, db.Pool))
	_, err = db.Pool.Exec(ctx, `CREATE TABLE filler (n int); INSERT INTO filler SELECT generate_series(1, 10000)`)
	require.NoError(t, err)
	code, out, stderr = cli(t, dbVars(db), "status")
	require.Equal(t, 0, code, stderr)
	t.Logf("status:\n%s", out)
	require.Contains(t, out, "OUTBOX  backlog 0")
	require.Contains(t, out, "backlog counts table rows only: in logical mode the events are WAL messages")
	require.Regexp(t, `slot oncekit_\S+ \(logical mode\): INACTIVE, no relay streams !; lag [0-9.]+ [KMG]iB, time unknown; WAL retained`, out)

	code, out, stderr = cli(t, dbVars(db), "status", "--json")
	require.Equal(t, 0, code, stderr)
	var rep report.Status
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.NotNil(t, rep.Outbox.Slot)
	require.Positive(t, rep.Outbox.Slot.LagBytes)
	require.False(t, rep.Outbox.Slot.Active)

	_, err = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, rep.Outbox.Slot.Name)
	require.NoError(t, err)
	code, out, stderr = cli(t, dbVars(db), "status")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "LOST, dropped (oncekit created it and it is gone): the relay stops; see the runbook !")
}
