package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// The fills below write the rows a long-running deployment retains, in
// bulk with generate_series, as they would look when retention comes for
// them: every row is past its table's retention (so the retention runs can
// delete the same rows the hot paths were measured against), in the states
// and with the key shapes production leaves. Row g is the g-th oldest, in
// every fill: timestamps grow with g over the span the table retains, spread
// over {rows}, the rows of the largest fill of the run, so that a smaller
// fill before it holds the oldest rows and a pass deleting the rows older
// than an age deletes a prefix of the heap, as in a deployment.

// fillOutbox adds events from through to-1: 256-byte payloads, ten events
// per ordering key, partitioned by key, enqueued 24–48 hours ago
// (publishOutbox then makes them published). Their transaction ID is 1, as
// migration 005 gives the history it moves: a relay orders rows by
// (txid, seq), and the history must come before the rows the hot paths
// enqueue between two fills, as older rows do in a deployment (a retention
// pass stops at the first row within retention).
const fillOutbox = `
INSERT INTO outbox (id, txid, partition, ordering_key, subject, payload, created_at)
SELECT gen_random_uuid(), '1', abs(hashtext('key-' || g / 10)) % 16, 'key-' || g / 10, 'scale.history',
	decode(repeat(md5(g::text), 8), 'hex'), now() - interval '48 hours' + g * (interval '24 hours' / {rows})
FROM generate_series($1::bigint, $2::bigint - 1) g`

// publishOutbox moves every relay partition's cursor past the last row, so
// that the rows fillOutbox wrote are published history.
const publishOutbox = `
INSERT INTO relay_partitions (partition, cursor_txid, cursor_seq)
SELECT p, l.txid, l.seq FROM generate_series(0, 15) p,
	(SELECT txid, seq FROM outbox ORDER BY txid DESC, seq DESC LIMIT 1) l
ON CONFLICT (partition) DO UPDATE SET cursor_txid = excluded.cursor_txid, cursor_seq = excluded.cursor_seq`

// fillClaims adds the claims of consumer "bench" (the benchmark consumer's
// name), random message IDs as event IDs are (derived IDs are hashes),
// processed 7–14 days ago.
const fillClaims = `
INSERT INTO processed_messages (consumer, message_id, processed_at)
SELECT 'bench', gen_random_uuid(), now() - interval '14 days' + g * (interval '7 days' / {rows})
FROM generate_series($1::bigint, $2::bigint - 1) g`

// fillEffects adds settled effects over three kinds recorded 30–60 days ago:
// 99% confirmed, 1% failed, and one in 10,000 of the newest 100,000 unknown
// (those wait in the due index at 'infinity', as the dispatcher leaves
// them): unknown effects are an operator's backlog, resolved as they come,
// not history, so 10 wait however long the history (one at 1,000 rows). Keys are derived as
// DeriveKey derives them (64 hex characters of a hash).
const fillEffects = `
INSERT INTO side_effects (source_id, kind, payload, idempotency_key, state, attempts, next_attempt_at,
	provider_ref, created_at, fired_at, confirmed_at, updated_at)
SELECT 'hist-' || g, k.kind, decode(repeat(md5(g::text), 8), 'hex'),
	encode(sha256(convert_to('hist-' || g || '/' || k.kind, 'UTF8')), 'hex'),
	s.state, 1, CASE s.state WHEN 'unknown' THEN 'infinity'::timestamptz END,
	CASE s.state WHEN 'confirmed' THEN 'ref-' || g END, t.at, t.at, CASE s.state WHEN 'confirmed' THEN t.at END, t.at
FROM generate_series($1::bigint, $2::bigint - 1) g,
	LATERAL (SELECT (ARRAY['order.paid', 'email.receipt', 'sms.send'])[1 + g % 3] AS kind) k,
	LATERAL (SELECT CASE WHEN g % 10000 = 7 AND g >= {rows} - 100000 THEN 'unknown' WHEN g % 100 = 3 THEN 'failed' ELSE 'confirmed' END AS state) s,
	LATERAL (SELECT now() - interval '60 days' + g * (interval '30 days' / {rows}) AS at) t`

// fillKeys adds completed edge records over three operations, the keys
// UUIDs as clients usually send, with a stored JSON response; they expired
// within the last day (retention deletes a completed record once expired).
const fillKeys = `
INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code, response_headers,
	response_body, created_at, completed_at, expires_at)
SELECT '', (ARRAY['bench-create', 'refund', 'capture'])[1 + g % 3], gen_random_uuid()::text,
	sha256(convert_to(g::text, 'UTF8')), 'completed', 201,
	'{"Content-Type": ["application/json"]}', convert_to('{"id":"' || md5(g::text) || '","amount":100,"currency":"EUR"}', 'UTF8'),
	t.at - interval '24 hours', t.at - interval '24 hours', t.at
FROM generate_series($1::bigint, $2::bigint - 1) g,
	LATERAL (SELECT now() - interval '25 hours' + g * (interval '24 hours' / {rows}) AS at) t`

// fill adds rows from through to-1 with the fill statement sql ({rows} in it
// stands for of, the rows of the run's largest fill), then runs the
// statements after (no parameters). The table's indexes and key
// constraints are dropped first and built again after, as a bulk load does
// (far faster than maintaining a random-key B-tree row by row), and the
// table is then vacuumed and analyzed, as autovacuum would leave it. A
// checkpoint comes first, so that the WAL the fill and the measurements
// after it write counts from it: max_wal_size does not bring one on in the
// middle of them, and the hot paths run as they do between two checkpoints
// spaced by time (the first writes to each page after a checkpoint, which
// log the whole page, are decision 020's, not the table size's).
func fill(b *testing.B, db *testenv.DB, table, sql string, from, to, of int, after ...string) {
	b.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET maintenance_work_mem = '256MB'; SET synchronous_commit = off`); err != nil {
		b.Fatal(err)
	}
	defer conn.Exec(ctx, `RESET maintenance_work_mem; RESET synchronous_commit`) //nolint:errcheck
	// Constraints first (their indexes go with them), then the other indexes.
	rows, err := conn.Query(ctx, `
		SELECT format('ALTER TABLE %I DROP CONSTRAINT %I', $1::text, conname),
			format('ALTER TABLE %I ADD CONSTRAINT %I %s', $1::text, conname, pg_get_constraintdef(oid))
		FROM pg_constraint WHERE conrelid = $1::regclass AND contype IN ('p', 'u')
		UNION ALL
		SELECT format('DROP INDEX %I', c.relname), pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid)`, table)
	if err != nil {
		b.Fatal(err)
	}
	type ddl struct{ Drop, Add string }
	defs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ddl])
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range defs {
		if _, err := conn.Exec(ctx, d.Drop); err != nil {
			b.Fatal(err)
		}
	}
	checkpoint(b, conn)
	if _, err := conn.Exec(ctx, strings.ReplaceAll(sql, "{rows}", strconv.Itoa(of)), from, to); err != nil {
		b.Fatalf("fill %s: %v", table, err)
	}
	for _, d := range defs {
		if _, err := conn.Exec(ctx, d.Add); err != nil {
			b.Fatalf("%s: %v", d.Add, err)
		}
	}
	for _, q := range after {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("VACUUM ANALYZE %s", pgx.Identifier{table}.Sanitize())); err != nil {
		b.Fatal(err)
	}
	// The fill's writes sit in the page cache until the kernel flushes them,
	// a gigabyte at once some 30 s later, stalling every fsync meanwhile
	// (the WAL's, JetStream's): flushed here, not in a measurement.
	syscall.Sync()
	prewarmIndexes(b, conn, table)
}

// prewarmIndexes reads table's indexes into shared_buffers, as much of
// them as fits. The fill builds them outside shared_buffers (an index
// build writes its pages directly), while a deployment's hot paths, which
// write into them all day, keep them there: without this, the first
// measurements after a fill read every leaf page they touch from the
// operating system's cache, 49,000 reads over the first 60,000 claims at
// 10M rows, and time the cold cache rather than the table's size. It needs
// the pg_prewarm extension (PostgreSQL's contrib); a server without it is
// measured cold, and the run says so.
func prewarmIndexes(b *testing.B, conn *pgxpool.Conn, table string) {
	b.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_prewarm SCHEMA public`); err != nil {
		fmt.Printf("prewarm: %s's indexes left cold: %v\n", table, err)
		return
	}
	if _, err := conn.Exec(ctx, `SELECT public.pg_prewarm(indexrelid) FROM pg_index WHERE indrelid = $1::regclass`, table); err != nil {
		b.Fatal(err)
	}
}

// checkpoint writes a checkpoint through q.
func checkpoint(b *testing.B, q oncekit.Querier) {
	b.Helper()
	if _, err := q.Exec(context.Background(), "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
}
