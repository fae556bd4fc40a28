package outbox

import "github.com/oncekit/oncekit/internal/pgsql"

// relaySQL holds the relay's statements, rendered once for a schema.
type relaySQL struct {
	ensurePartitions, partitionsBeyond             string
	heartbeat, acquire, renew, release, removeNode string
	probe, fetch, fetchMain, advance, settle       string
	prune                                          string
	oldest, parked                                 string
}

func renderRelaySQL(schema string) relaySQL {
	q := relaySQL{
		ensurePartitions: `INSERT INTO {schema}.relay_partitions (partition)
			SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING`,
		partitionsBeyond: `SELECT EXISTS (SELECT 1 FROM {schema}.outbox WHERE partition >= $1)`,

		// Heartbeat, forget dead nodes, count the live ones (dead: no
		// heartbeat for $2 seconds).
		heartbeat: `WITH hb AS (
				INSERT INTO {schema}.relay_nodes (id, heartbeat_at) VALUES ($1, now())
				ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()),
			gone AS (DELETE FROM {schema}.relay_nodes WHERE heartbeat_at < now() - make_interval(secs => $2) AND id <> $1)
			SELECT 1 + count(*) FROM {schema}.relay_nodes WHERE id <> $1 AND heartbeat_at >= now() - make_interval(secs => $2)`,
		// Take up to $3 free or expired partitions; every change of owner
		// bumps the fencing token.
		acquire: `UPDATE {schema}.relay_partitions p
			SET owner = $1, token = p.token + 1, expires_at = now() + make_interval(secs => $2)
			WHERE p.partition IN (
				SELECT partition FROM {schema}.relay_partitions
				WHERE (owner IS NULL OR expires_at < now()) AND partition < $4
				ORDER BY partition LIMIT $3 FOR UPDATE SKIP LOCKED)
			RETURNING p.partition, p.token`,
		renew: `UPDATE {schema}.relay_partitions SET expires_at = now() + make_interval(secs => $2)
			WHERE owner = $1 AND partition = ANY($3::int[])
			RETURNING partition, token`,
		release: `UPDATE {schema}.relay_partitions SET owner = NULL, expires_at = '-infinity'
			WHERE owner = $1 AND partition = ANY($2::int[])`,
		removeNode: `DELETE FROM {schema}.relay_nodes WHERE id = $1`,

		// Which of the partitions $1 have rows that became readable since
		// the snapshot xmin $2 of the previous look; and whether committed
		// rows are still waiting for the xmin to pass them (an older
		// transaction is still running), in which case the prober looks
		// again soon instead of backing off.
		probe: `WITH x AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin)
			SELECT x.xmin::text, array(
				SELECT p FROM unnest($1::int[]) AS p WHERE EXISTS (
					SELECT 1 FROM {schema}.outbox o
					WHERE o.partition = p
					AND o.txid >= $2::text::xid8 AND o.txid < x.xmin)),
			EXISTS (
				SELECT 1 FROM unnest($1::int[]) AS p WHERE EXISTS (
					SELECT 1 FROM {schema}.outbox o WHERE o.partition = p AND o.txid >= x.xmin))
			FROM x`,

		// One batch of partition $1, at most $4 rows, only while this relay
		// holds the lease (otherwise the cursor is NULL and nothing matches).
		// First the retries: the held rows (all behind the cursor) of every
		// key whose first held row is due, each key's chain in order, and
		// due held rows without a key. Then the main rows: after the cursor
		// and below the snapshot's xmin (no running transaction can still add
		// an earlier row), in the order of their writing transactions, an
		// index range scan of outbox_pending that stops at the limit.
		// Per row: whether it is a retry, whether it is held (a main row only
		// when it was parked or backing off before migration 005), whether it
		// is due (not parked, not backing off), and for a main row whether its
		// key has held rows (it must wait for them); last, whether the
		// partition has any held row at all.
		fetch: `WITH l AS (
				SELECT cursor_txid, cursor_seq FROM {schema}.relay_partitions
				WHERE partition = $1 AND owner = $2 AND token = $3 AND expires_at > now()),
			heads AS (
				SELECT DISTINCT ON (b.ordering_key) b.ordering_key,
					b.parked_at IS NULL AND b.next_attempt_at <= now() AS due
				FROM {schema}.outbox b
				WHERE b.partition = $1 AND b.ordering_key <> '' AND ` + held("b") + `
				AND (b.txid, b.seq) <= ((SELECT cursor_txid FROM l), (SELECT cursor_seq FROM l))
				ORDER BY b.ordering_key, b.txid, b.seq),
			retry AS (
				SELECT h.seq, h.id, h.ordering_key, h.subject, h.payload, h.headers, h.created_at, h.attempts,
					h.parked_at IS NULL AND h.next_attempt_at <= now() AS due
				FROM {schema}.outbox h
				WHERE h.partition = $1 AND ` + held("h") + `
				AND (h.txid, h.seq) <= ((SELECT cursor_txid FROM l), (SELECT cursor_seq FROM l))
				AND CASE WHEN h.ordering_key = '' THEN h.parked_at IS NULL AND h.next_attempt_at <= now()
					ELSE h.ordering_key IN (SELECT ordering_key FROM heads WHERE due) END
				ORDER BY h.txid, h.seq
				LIMIT $4)
			SELECT true, seq, id, ordering_key, subject, payload, headers, created_at, attempts, true, due, false,
				EXISTS (SELECT 1 FROM {schema}.outbox b WHERE b.partition = $1 AND ` + held("b") + `)
			FROM retry
			UNION ALL (
			SELECT false, o.seq, o.id, o.ordering_key, o.subject, o.payload, o.headers, o.created_at, o.attempts,
				` + held("o") + `, o.parked_at IS NULL AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now()),
				o.ordering_key <> '' AND o.ordering_key IN (SELECT ordering_key FROM heads),
				EXISTS (SELECT 1 FROM {schema}.outbox b WHERE b.partition = $1 AND ` + held("b") + `)
			FROM {schema}.outbox o
			WHERE o.partition = $1
			AND (o.txid, o.seq) > ((SELECT cursor_txid FROM l), (SELECT cursor_seq FROM l))
			AND o.txid < (SELECT pg_snapshot_xmin(pg_current_snapshot()))
			ORDER BY o.txid, o.seq
			LIMIT $4 - (SELECT count(*) FROM retry))`,

		// fetch for a partition known to have no held rows: the main rows
		// only, in the same shape. The limit is a subquery, unknown to the
		// planner, as in fetch: the planner cannot estimate how many rows
		// follow the cursor and, knowing the limit, would read and sort every
		// row after it instead of walking the index and stopping at the limit.
		fetchMain: `WITH l AS (
				SELECT cursor_txid, cursor_seq FROM {schema}.relay_partitions
				WHERE partition = $1 AND owner = $2 AND token = $3 AND expires_at > now())
			SELECT false, o.seq, o.id, o.ordering_key, o.subject, o.payload, o.headers, o.created_at, o.attempts,
				` + held("o") + `, o.parked_at IS NULL AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now()),
				false, false
			FROM {schema}.outbox o
			WHERE o.partition = $1
			AND (o.txid, o.seq) > ((SELECT cursor_txid FROM l), (SELECT cursor_seq FROM l))
			AND o.txid < (SELECT pg_snapshot_xmin(pg_current_snapshot()))
			ORDER BY o.txid, o.seq
			LIMIT (SELECT $4::int)`,

		// The happy path's only write: move the cursor to row $4, fenced by
		// the lease token. Every row passed was acknowledged.
		advance: `WITH c AS (
				UPDATE {schema}.relay_partitions
				SET cursor_txid = (SELECT txid FROM {schema}.outbox WHERE seq = $4), cursor_seq = $4
				WHERE partition = $1 AND owner = $2 AND token = $3
				RETURNING 1),
			async AS (SELECT set_config('synchronous_commit', 'off', true))
			SELECT count(*) FROM c, async`,
		// Everything else, in one fenced statement: move the cursor to row
		// $4 (0: leave it), clear acknowledged held rows $5, count a failed
		// attempt for rows $6 (error $7, back off $8 seconds, park after $9
		// attempts), and hold rows $10 as followers of their blocked key.
		// Nothing changes unless the cursor row was updated under the token.
		settle: `WITH c AS (
				UPDATE {schema}.relay_partitions p
				SET cursor_txid = coalesce((SELECT txid FROM {schema}.outbox WHERE seq = $4), p.cursor_txid),
					cursor_seq = coalesce((SELECT seq FROM {schema}.outbox WHERE seq = $4), p.cursor_seq)
				WHERE p.partition = $1 AND p.owner = $2 AND p.token = $3
				RETURNING 1),
			acked AS (
				UPDATE {schema}.outbox o
				SET next_attempt_at = NULL, parked_at = NULL, last_error = NULL, attempts = o.attempts + 1
				WHERE o.seq = ANY($5::bigint[]) AND o.partition = $1 AND EXISTS (SELECT 1 FROM c)
				RETURNING 1),
			failed AS (
				UPDATE {schema}.outbox o SET
					attempts = o.attempts + 1,
					last_error = f.err,
					next_attempt_at = now() + make_interval(secs => f.delay),
					parked_at = CASE WHEN o.attempts + 1 >= $9 THEN now() END
				FROM unnest($6::bigint[], $7::text[], $8::float8[]) AS f(seq, err, delay)
				WHERE o.seq = f.seq AND o.partition = $1 AND EXISTS (SELECT 1 FROM c)
				RETURNING o.parked_at IS NOT NULL AS parked),
			follow AS (
				UPDATE {schema}.outbox o SET next_attempt_at = '-infinity'
				WHERE o.seq = ANY($10::bigint[]) AND o.partition = $1 AND NOT ` + held("o") + `
				AND EXISTS (SELECT 1 FROM c)
				RETURNING 1),
			async AS (SELECT set_config('synchronous_commit', 'off', true))
			SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM acked),
				(SELECT count(*) FROM failed), (SELECT count(*) FROM failed WHERE parked), (SELECT count(*) FROM follow)
			FROM async`,

		// Retention, one batch of partition $1: published rows (behind the
		// cursor, not held) enqueued more than $2 seconds ago. The first $3
		// published rows in (txid, seq) order after ($4, $5), where the
		// previous batch of the pass ended, are looked at, the oldest by
		// construction, so the scan never walks the partition's history,
		// nor the index entries of the rows the pass already deleted (dead
		// until vacuum: starting each batch from the partition's start
		// made a pass quadratic in the rows it deleted). Rows are deleted by
		// ctid (locked by the same statement, so it cannot change), which
		// spares a primary-key descent per row. It returns the rows looked
		// at and deleted, and the last row looked at.
		prune: `WITH l AS (SELECT cursor_txid, cursor_seq FROM {schema}.relay_partitions WHERE partition = $1),
			front AS (
				SELECT o.ctid, o.txid, o.seq, o.created_at FROM {schema}.outbox o
				WHERE o.partition = $1
				AND (o.txid, o.seq) <= ((SELECT cursor_txid FROM l), (SELECT cursor_seq FROM l))
				AND (o.txid, o.seq) > ($4::text::xid8, $5::bigint)
				AND NOT ` + held("o") + `
				ORDER BY o.txid, o.seq
				LIMIT (SELECT $3::int) -- unknown to the planner: walk the index (see fetchMain)
				FOR UPDATE SKIP LOCKED),
			gone AS (
				DELETE FROM {schema}.outbox o
				WHERE o.ctid = ANY(ARRAY(SELECT ctid FROM front WHERE created_at < now() - make_interval(secs => $2)))
				RETURNING 1),
			last AS (SELECT txid, seq FROM front ORDER BY txid DESC, seq DESC LIMIT 1)
			SELECT (SELECT count(*) FROM front), (SELECT count(*) FROM gone),
				coalesce((SELECT txid::text FROM last), $4), coalesce((SELECT seq FROM last), $5)`,

		oldest: backlogSQL,
		parked: `SELECT count(*) FROM {schema}.outbox o WHERE o.parked_at IS NOT NULL AND ` + held("o"),
	}
	for _, p := range []*string{
		&q.ensurePartitions, &q.partitionsBeyond, &q.heartbeat, &q.acquire, &q.renew, &q.release,
		&q.removeNode, &q.probe, &q.fetch, &q.fetchMain, &q.advance, &q.settle, &q.prune, &q.oldest, &q.parked,
	} {
		*p = pgsql.Render(*p, schema)
	}
	return q
}
