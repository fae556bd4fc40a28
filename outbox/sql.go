package outbox

import (
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// Every statement of the package is here: the Outbox's (outboxSQL: Enqueue,
// List, Unpark, Backlog) and the Relay's (relaySQL), each rendered once for
// a schema.

// The state of a row follows from its partition's cursor in
// relay_partitions (migration 005): a row is published when it is at or
// before the cursor, (txid, seq) <= (cursor_txid, cursor_seq), and not held.
// Held rows wait for a retry, are parked, or follow a blocked row of their
// key. Everything else, after the cursor, is pending. A partition without a
// relay_partitions row has never been read: its cursor is before everything.

// held is true for a row that waits for a retry, is parked, or follows a
// blocked row of its key. It is the predicate of the partial index
// outbox_blocked, spelt the same way so that the planner uses the index.
func held(alias string) string {
	return "(" + alias + ".parked_at IS NOT NULL OR " + alias + ".next_attempt_at IS NOT NULL)"
}

// openEpoch is the last epoch whose rows a relay may publish: the current
// one or, while a repartition drains (phase 'drain'), the one before it.
// A main row of a later epoch is barred: the relay stops its batch before it.
const openEpoch = `(SELECT CASE WHEN phase = 'drain' THEN epoch - 1 ELSE epoch END FROM {schema}.outbox_epoch)`

// olderHeld is true, once a repartition's drain has left only held rows of
// earlier epochs (phase 'held'), for a row of alias whose key has such a
// row, in whatever partition: the row waits behind it as a follower does
// behind its key's blocked row. Other phases cost the read of one row: the
// phase test comes first and is false, not NULL, without a phase (phase is
// NULL between repartitions, and NULL AND EXISTS (…) evaluates the EXISTS,
// a scan of the outbox per row).
func olderHeld(alias string) string {
	return `(coalesce((SELECT phase = 'held' FROM {schema}.outbox_epoch), false) AND ` + alias + `.ordering_key <> '' AND EXISTS (
		SELECT 1 FROM {schema}.outbox x WHERE x.ordering_key = ` + alias + `.ordering_key
		AND x.epoch < ` + alias + `.epoch AND ` + held("x") + `))`
}

// partitionHeld is whether partition $1 has a held row: the first entry of
// outbox_blocked for it. In the order of that index, so that the planner
// reads it and not the table (which it did for a partition whose rows were
// mostly held: each fetch then read the whole outbox).
// (A scalar subquery: EXISTS drops its subquery's ORDER BY and LIMIT.)
var partitionHeld = `coalesce((SELECT true FROM {schema}.outbox b WHERE b.partition = $1 AND ` + held("b") + `
	ORDER BY b.partition, b.ordering_key, b.txid, b.seq LIMIT 1), false)`

// cursors lists every partition that has rows (up to the highest one, found
// at the end of the index outbox_pending) with its cursor as (part, ct, cs).
// The partitions come from an array: the planner takes a generate_series
// whose bound is a subquery for 1,000 rows, which prices the per-partition
// scans far higher than they are.
const cursors = `SELECT g.part, coalesce(p.cursor_txid, '2') AS ct, coalesce(p.cursor_seq, 0) AS cs
	FROM unnest(ARRAY(SELECT generate_series(0, (SELECT max(partition) FROM {schema}.outbox)))) AS g(part)
	LEFT JOIN {schema}.relay_partitions p ON p.partition = g.part`

// outboxSQL holds the Outbox's statements, rendered once for a schema.
type outboxSQL struct {
	insert, list, unpark, backlog, backlogByPartition string
	notify, notifyAll, partitions                     string
}

func renderOutboxSQL(schema string) outboxSQL {
	q := outboxSQL{
		insert:             insertSQL,
		list:               listSQL,
		unpark:             unparkSQL,
		backlog:            backlogSQL,
		backlogByPartition: backlogByPartitionSQL,
		// Wake listening relays: Enqueue's empty payload, Unpark's
		// notifyAll.
		notify:    `SELECT pg_notify($1, '')`,
		notifyAll: `SELECT pg_notify($1, $2)`,
		// The writers' partition count (migration 023).
		partitions: `SELECT partitions FROM {schema}.outbox_epoch`,
	}
	for _, p := range []*string{&q.insert, &q.list, &q.unpark, &q.backlog, &q.backlogByPartition, &q.partitions} {
		*p = pgsql.Render(*p, schema)
	}
	return q
}

// relayPartitionsSQL is the relays' partition count: the rows 0 to N-1 of
// relay_partitions (migration 011), the writers' count and the partitions
// beyond it that a repartition has not retired yet.
const relayPartitionsSQL = `SELECT ` + relayPartitionsExpr

// insertSQL writes the messages, each in the partition that the count of
// outbox_epoch gives its key's hash ($2, the 64 bits of partitionHash as a
// bigint), stamped with the epoch. Reading outbox_epoch takes its ACCESS
// SHARE lock, which the transaction keeps until it ends: Repartition's ACCESS
// EXCLUSIVE lock waits for every writer in flight, and a writer that comes
// after it waits for its commit and then (READ COMMITTED: the statement's
// snapshot is taken after its locks) sees the new count. The hash modulo the
// count is partitionOf's, in bigint arithmetic: its two 32-bit halves.
// Without a row in outbox_epoch the partition is NULL and the INSERT fails
// (ErrNoEpoch), rather than writing nothing. A REPEATABLE READ or
// SERIALIZABLE writer reads the count from its transaction's snapshot, which
// may predate a repartition: for it only, outbox_epoch_fresh (migration 023)
// takes a share lock on the row, which fails with a serialization error
// when the row changed since the snapshot.
var insertSQL = `
INSERT INTO {schema}.outbox (id, partition, epoch, ordering_key, subject, payload, headers)
SELECT m.id, ` + partitionExpr("m.h", "(SELECT partitions FROM {schema}.outbox_epoch)") + `,
	(SELECT epoch FROM {schema}.outbox_epoch), m.key, m.subject, m.payload, m.headers::jsonb
FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::bytea[], $6::text[])
	WITH ORDINALITY AS m(id, h, key, subject, payload, headers, ord)
WHERE (SELECT CASE WHEN current_setting('transaction_isolation') = 'read committed' THEN true
	ELSE {schema}.outbox_epoch_fresh() END)
ORDER BY m.ord
ON CONFLICT (id) DO NOTHING
RETURNING id`

// partitionExpr is the SQL of partitionOf: the unsigned 64-bit hash h (a
// bigint holding its bits) modulo n, as ((hi mod n) * (2^32 mod n) + lo)
// mod n, which stays within a bigint for any n up to MaxPartitions.
func partitionExpr(h, n string) string {
	return "(((((" + h + " >> 32) & 4294967295) % " + n + ") * (4294967296 % " + n + ") + (" + h + " & 4294967295)) % " + n + ")::int"
}

// listSQL selects by state ($1) at most $2 unpublished rows in publishing
// order and $2 published ones, newest first. Published history can be large
// (it is kept for Retention), so each partition is read through its index
// from the cursor: forward for the rows after it, backward for the newest
// published ones; held rows behind the cursor come from their small index.
var listSQL = `WITH c AS (` + cursors + `),
	want AS (SELECT $1::text AS state),
	u AS (
		SELECT a.* FROM c, LATERAL (
			SELECT o.* FROM {schema}.outbox o
			WHERE o.partition = c.part AND (o.txid, o.seq) > (c.ct, c.cs)
			AND (SELECT state FROM want) IN ('', 'pending', 'parked')
			AND CASE (SELECT state FROM want) WHEN 'pending' THEN o.parked_at IS NULL
				WHEN 'parked' THEN o.parked_at IS NOT NULL ELSE true END
			ORDER BY o.txid, o.seq LIMIT $2) a
		UNION ALL
		SELECT o.* FROM {schema}.outbox o JOIN c ON c.part = o.partition
		WHERE ` + held("o") + ` AND (o.txid, o.seq) <= (c.ct, c.cs)
		AND (SELECT state FROM want) IN ('', 'pending', 'parked')
		AND CASE (SELECT state FROM want) WHEN 'pending' THEN o.parked_at IS NULL
			WHEN 'parked' THEN o.parked_at IS NOT NULL ELSE true END),
	p AS (
		SELECT a.* FROM c, LATERAL (
			SELECT o.* FROM {schema}.outbox o
			WHERE o.partition = c.part AND (o.txid, o.seq) <= (c.ct, c.cs) AND NOT ` + held("o") + `
			AND (SELECT state FROM want) IN ('', 'published')
			ORDER BY o.txid DESC, o.seq DESC LIMIT $2) a)
	SELECT * FROM (
	SELECT seq, id, partition, ordering_key, subject, CASE WHEN txid <> '1' THEN length(payload) END AS size, headers, created_at,
		attempts, next_attempt_at, coalesce(last_error, '') AS last_error, parked_at, false AS published
	FROM u ORDER BY txid, seq LIMIT $2) u
	UNION ALL
	SELECT * FROM (
	SELECT seq, id, partition, ordering_key, subject, CASE WHEN txid <> '1' THEN length(payload) END, headers, created_at,
		attempts, next_attempt_at, '', parked_at, true
	FROM p ORDER BY txid DESC, seq DESC LIMIT $2) p`

// unparkSQL makes parked rows due at once ('-infinity'): they stay held, so
// that a row behind its partition's cursor is not taken for published.
const unparkSQL = `UPDATE {schema}.outbox SET parked_at = NULL, next_attempt_at = '-infinity', attempts = 0
	WHERE parked_at IS NOT NULL AND ($1::boolean OR id = ANY($2::uuid[]))`

// unpublishedSQL is, per partition, the count of unpublished, unparked
// rows and the oldest one's created_at (u: part, n, oldest): the rows after
// each partition's cursor (an index range scan per partition, forced by the
// aggregate in LATERAL, so the history behind the cursor is never read), and
// the held rows behind it (from the small index outbox_blocked).
var unpublishedSQL = `WITH c AS (` + cursors + `),
	u AS (
		SELECT c.part, a.n, a.oldest FROM c, LATERAL (
			SELECT count(*) AS n, min(o.created_at) AS oldest FROM {schema}.outbox o
			WHERE o.partition = c.part AND (o.txid, o.seq) > (c.ct, c.cs) AND o.parked_at IS NULL) a
		UNION ALL
		SELECT o.partition, count(*), min(o.created_at) FROM {schema}.outbox o JOIN c ON c.part = o.partition
		WHERE ` + held("o") + ` AND o.parked_at IS NULL AND (o.txid, o.seq) <= (c.ct, c.cs)
		GROUP BY o.partition)`

// backlogSQL counts the unpublished, unparked rows and gives the age in
// seconds of the oldest (0 when there is none).
var backlogSQL = unpublishedSQL + `
	SELECT coalesce(sum(n), 0)::bigint, coalesce(extract(epoch FROM now() - min(oldest)), 0)::float8 FROM u`

// backlogByPartitionSQL is backlogSQL per partition, partitions without
// backlog left out.
var backlogByPartitionSQL = unpublishedSQL + `
	SELECT part, sum(n)::bigint, coalesce(extract(epoch FROM now() - min(oldest)), 0)::float8 FROM u
	GROUP BY part HAVING sum(n) > 0 ORDER BY part`

// relaySQL holds the relay's statements, rendered once for a schema.
type relaySQL struct {
	epochSQL
	partitionsBeyond                                string
	heartbeat, acquire, renew, release, removeNode  string
	probe, sweep, fetch, fetchMain, advance, settle string
	prune                                           string
	oldest, parked                                  string
	listen                                          string
}

func renderRelaySQL(schema string) relaySQL {
	q := relaySQL{
		// In the order of outbox_pending, so that a plan made while the
		// outbox was small does not scan it whole once it has grown.
		partitionsBeyond: `SELECT coalesce((SELECT true FROM {schema}.outbox WHERE partition >= $1 ORDER BY partition LIMIT 1), false)`,

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
		// Renew the leases held; each says whether its cursor is ahead of
		// the server (the database was swapped under the relay), at no
		// extra round trip. The relay confirms it with movedSQL, whose
		// snapshot cannot predate the cursor it reads, before it stops.
		renew: `UPDATE {schema}.relay_partitions SET expires_at = now() + make_interval(secs => $2)
			WHERE owner = $1 AND partition = ANY($3::int[])
			RETURNING partition, token, cursor_txid >= pg_snapshot_xmax(pg_current_snapshot())`,
		release: `UPDATE {schema}.relay_partitions SET owner = NULL, expires_at = '-infinity'
			WHERE owner = $1 AND partition = ANY($2::int[])`,
		removeNode: `DELETE FROM {schema}.relay_nodes WHERE id = $1`,

		// Which of the partitions $1 have rows that became readable since
		// the snapshot xmin $2 of the previous look; and whether committed
		// rows are still waiting for the xmin to pass them (an older
		// transaction is still running), in which case the prober looks
		// again soon instead of backing off. Each partition is looked up on
		// its own (LATERAL, LIMIT 1): as semi-joins, the plan pgx's prepared
		// statement keeps, made while the outbox was nearly empty, hashed a
		// scan of the whole outbox and kept doing so as it grew, four times
		// a second per relay, until the table was next analyzed.
		probe: `WITH x AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin)
			SELECT x.xmin::text, array(
				SELECT p FROM unnest($1::int[]) AS p, LATERAL (
					SELECT 1 FROM {schema}.outbox o
					WHERE o.partition = p
					AND o.txid >= $2::text::xid8 AND o.txid < x.xmin LIMIT 1) r),
			EXISTS (
				SELECT 1 FROM unnest($1::int[]) AS p, LATERAL (
					SELECT 1 FROM {schema}.outbox o WHERE o.partition = p AND o.txid >= x.xmin LIMIT 1) r)
			FROM x`,

		// Which of the partitions $1 have work that the probe does not
		// see: a row after the cursor (one a batch left behind, or written
		// before the previous look), or a held row that is due and heads its
		// key (a retry come due, an unparked row). Followers of a key whose
		// head is not due, and parked rows, are no work: a partition that
		// holds only those is not named. Per partition, its last row (one
		// step back along outbox_pending: the planner, which cannot tell
		// where a cursor lies, would scan the table for a row after it) and
		// the small outbox_blocked.
		sweep: `SELECT coalesce(array_agg(p.partition), '{}') FROM {schema}.relay_partitions p
			WHERE p.partition = ANY($1::int[]) AND (
				EXISTS (SELECT 1 FROM (
					SELECT o.txid, o.seq FROM {schema}.outbox o WHERE o.partition = p.partition
					ORDER BY o.txid DESC, o.seq DESC LIMIT 1) last
					WHERE (last.txid, last.seq) > (p.cursor_txid, p.cursor_seq))
				OR EXISTS (SELECT 1 FROM {schema}.outbox h WHERE h.partition = p.partition AND ` + held("h") + `
					AND h.parked_at IS NULL AND h.next_attempt_at <= now() AND NOT ` + olderHeld("h") + `
					AND (h.ordering_key = '' OR NOT EXISTS (
						SELECT 1 FROM {schema}.outbox e WHERE e.partition = h.partition
						AND e.ordering_key = h.ordering_key AND ` + held("e") + `
						AND (e.txid, e.seq) < (h.txid, h.seq)))))`,

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
		// key has held rows (it must wait for them, or for a held row of an
		// earlier epoch: olderHeld); whether the partition has any held row
		// at all; last, whether a main row is barred by a repartition's
		// drain (openEpoch): the batch ends before it.
		fetch: `WITH l AS (
				SELECT cursor_txid, cursor_seq FROM {schema}.relay_partitions
				WHERE partition = $1 AND owner = $2 AND token = $3 AND expires_at > now()),
			heads AS (
				SELECT DISTINCT ON (b.ordering_key) b.ordering_key,
					b.parked_at IS NULL AND b.next_attempt_at <= now() AND NOT ` + olderHeld("b") + ` AS due
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
				` + partitionHeld + `, false
			FROM retry
			UNION ALL (
			SELECT false, o.seq, o.id, o.ordering_key, o.subject, o.payload, o.headers, o.created_at, o.attempts,
				` + held("o") + `, o.parked_at IS NULL AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now()),
				o.ordering_key <> '' AND (o.ordering_key IN (SELECT ordering_key FROM heads) OR ` + olderHeld("o") + `),
				` + partitionHeld + `,
				o.epoch > ` + openEpoch + `
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
				` + olderHeld("o") + `, false, o.epoch > ` + openEpoch + `
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
		// ctid, which spares a primary-key descent per row. One pass at a
		// time works on a partition: the batch takes the partition's
		// advisory lock or, when another relay's pass holds it, looks at no
		// row (that pass deletes them). The rows themselves are not locked
		// (FOR UPDATE wrote a lock into every row before its deletion, a
		// quarter of a pass's time and a sixth of its WAL: decision 019). A
		// row another transaction updated since the statement's snapshot
		// has a new ctid and stays (PostgreSQL 15 follows the update and
		// checks the ctid again); the DELETE also checks again that the row
		// is neither held nor within retention, so that this holds whatever
		// the server version does. (Nothing updates a published row that is
		// not held in any case.) The batch commits without waiting for its
		// WAL to reach the disk (decision 022): a crash may undo the last
		// batches, whose rows the next pass deletes again.
		// It returns whether it took the partition, the rows looked at and
		// deleted, whether one looked at is within retention, and the last
		// row looked at.
		prune: `WITH l AS (SELECT cursor_txid, cursor_seq FROM {schema}.relay_partitions
				WHERE partition = $1 AND pg_try_advisory_xact_lock(hashtext('oncekit.outbox.prune:{schema}'), $1)),
			front AS (
				SELECT o.ctid, o.txid, o.seq, o.created_at FROM {schema}.outbox o
				WHERE o.partition = $1
				AND (o.txid, o.seq) <= ((SELECT cursor_txid FROM l), (SELECT cursor_seq FROM l))
				AND (o.txid, o.seq) > ($4::text::xid8, $5::bigint)
				AND NOT ` + held("o") + `
				ORDER BY o.txid, o.seq
				LIMIT (SELECT $3::int)), -- unknown to the planner: walk the index (see fetchMain)
			gone AS (
				DELETE FROM {schema}.outbox o
				WHERE o.ctid = ANY(ARRAY(SELECT ctid FROM front WHERE created_at < now() - make_interval(secs => $2)))
				AND NOT ` + held("o") + ` AND o.created_at < now() - make_interval(secs => $2)
				RETURNING 1),
			last AS (SELECT txid, seq FROM front ORDER BY txid DESC, seq DESC LIMIT 1),
			async AS (SELECT set_config('synchronous_commit', 'off', true))
			SELECT EXISTS (SELECT FROM l), (SELECT count(*) FROM front), (SELECT count(*) FROM gone),
				EXISTS (SELECT FROM front WHERE created_at >= now() - make_interval(secs => $2)),
				coalesce((SELECT txid::text FROM last), $4), coalesce((SELECT seq FROM last), $5)
			FROM async`,

		oldest: backlogSQL,
		parked: `SELECT count(*) FROM {schema}.outbox o WHERE o.parked_at IS NOT NULL AND ` + held("o"),
	}
	q.epochSQL = renderEpochSQL(schema)
	q.listen = "LISTEN " + pgx.Identifier{NotifyChannel(schema)}.Sanitize()
	for _, p := range []*string{
		&q.partitionsBeyond, &q.heartbeat, &q.acquire, &q.renew, &q.release,
		&q.removeNode, &q.probe, &q.sweep, &q.fetch, &q.fetchMain, &q.advance, &q.settle, &q.prune, &q.oldest, &q.parked,
	} {
		*p = pgsql.Render(*p, schema)
	}
	return q
}
