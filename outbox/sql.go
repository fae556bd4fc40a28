package outbox

import "github.com/oncekit/oncekit/internal/pgsql"

// relaySQL holds the relay's statements, rendered once for a schema.
type relaySQL struct {
	ensurePartitions, partitionsBeyond                                    string
	heartbeat, acquire, renew, release, removeNode                        string
	probe, fetch, markPublished, deletePublished, markFailed, deleteBatch string
	oldest, parked                                                        string
}

// fence is true while the relay still holds partition $1's lease under the
// token it read rows with. Every write of a batch is conditioned on it.
const fence = `EXISTS (SELECT 1 FROM {schema}.relay_partitions l WHERE l.partition = $1 AND l.owner = $2 AND l.token = $3)`

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

		// Rows of partition $1 ready to publish, in the order of their
		// writing transactions: only below the snapshot's xmin (no running
		// transaction can still add an earlier row), never a row of a key
		// that has a blocked (retrying or parked) row, and only while this
		// relay holds the lease. The blocked keys are collected once from
		// their small index, so the main scan walks outbox_pending in order
		// and stops at the limit.
		fetch: `SELECT o.seq, o.id, o.ordering_key, o.subject, o.payload, o.headers, o.created_at, o.attempts
			FROM {schema}.outbox o
			WHERE o.partition = $1 AND o.parked_at IS NULL
			AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
			AND o.txid < (SELECT pg_snapshot_xmin(pg_current_snapshot()))
			AND o.ordering_key <> ALL (ARRAY(
				SELECT DISTINCT b.ordering_key FROM {schema}.outbox b
				WHERE b.partition = $1 AND b.ordering_key <> ''
				AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL)
				AND (b.parked_at IS NOT NULL OR b.next_attempt_at > now())))
			AND EXISTS (SELECT 1 FROM {schema}.relay_partitions l
				WHERE l.partition = $1 AND l.owner = $2 AND l.token = $3 AND l.expires_at > now())
			ORDER BY o.txid, o.seq
			LIMIT $4`,
		// Move acked rows to outbox_published.
		markPublished: `WITH done AS (
				DELETE FROM {schema}.outbox
				WHERE seq = ANY($4::bigint[]) AND partition = $1 AND ` + fence + `
				RETURNING id, seq, partition, ordering_key, subject, created_at, attempts),
			kept AS (
				INSERT INTO {schema}.outbox_published (id, seq, partition, ordering_key, subject, created_at, attempts)
				SELECT id, seq, partition, ordering_key, subject, created_at, attempts + 1 FROM done),
			async AS (SELECT set_config('synchronous_commit', 'off', true))
			SELECT count(*) FROM done, async`,
		deletePublished: `WITH done AS (DELETE FROM {schema}.outbox
				WHERE seq = ANY($4::bigint[]) AND partition = $1 AND ` + fence + ` RETURNING 1),
			async AS (SELECT set_config('synchronous_commit', 'off', true))
			SELECT count(*) FROM done, async`,
		// Count a failed attempt: back off, park after $8 attempts.
		markFailed: `UPDATE {schema}.outbox o SET
				attempts = o.attempts + 1,
				last_error = f.err,
				next_attempt_at = now() + make_interval(secs => f.delay),
				parked_at = CASE WHEN o.attempts + 1 >= $7 THEN now() END
			FROM unnest($4::bigint[], $5::text[], $6::float8[]) AS f(seq, err, delay)
			WHERE o.seq = f.seq AND o.partition = $1 AND ` + fence + `
			RETURNING o.parked_at IS NOT NULL`,

		deleteBatch: `DELETE FROM {schema}.outbox_published WHERE seq IN (
			SELECT seq FROM {schema}.outbox_published
			WHERE published_at < now() - make_interval(secs => $1)
			LIMIT $2 FOR UPDATE SKIP LOCKED)`,
		oldest: `SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
			FROM {schema}.outbox WHERE parked_at IS NULL`,
		parked: `SELECT count(*) FROM {schema}.outbox
			WHERE parked_at IS NOT NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL)`,
	}
	for _, p := range []*string{
		&q.ensurePartitions, &q.partitionsBeyond, &q.heartbeat, &q.acquire, &q.renew, &q.release,
		&q.removeNode, &q.probe, &q.fetch, &q.markPublished, &q.deletePublished, &q.markFailed, &q.deleteBatch, &q.oldest, &q.parked,
	} {
		*p = pgsql.Render(*p, schema)
	}
	return q
}
