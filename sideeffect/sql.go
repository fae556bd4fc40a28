package sideeffect

import "github.com/oncekit/oncekit/internal/pgsql"

// genericPlan makes the rest of the implicit transaction it runs in use
// generic plans for prepared statements. The dispatcher's statements take
// arrays and a LIMIT as parameters, so PostgreSQL's default (plan_cache_mode
// auto) judges a custom plan cheaper and plans every execution again: about
// 0.2–0.5 ms of backend CPU per statement, as much as executing a claim of 30
// rows. The generic plans are the same plans (index scan on the due index,
// TID scan, primary-key nested loop), built once per connection.
//
// Sorts are off for the same statement: a claim reads the due index in its
// order and stops after LIMIT rows. The index also holds the rows in flight
// (a claim leaves a row at its due time), so a planner without statistics
// on how few of its rows are pending (none yet, or stale ones) prefers to
// read every due row and sort them, for each claim: ten times the CPU of
// the ordered scan, measured on 20,000 effects.
const genericPlan = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_sort', 'off', true)`

// statements holds every other SQL statement, rendered once for the schema.
type statements struct {
	insert, selectBySource               string
	sync, refire, reconcile, markUnknown string
	countUnknown, pruneBounds, prune     string
	list, get, retry, resolve            string
}

const rowColumns = `id, source_id, kind, payload, idempotency_key, state, attempts,
	CASE WHEN next_attempt_at < 'infinity' THEN next_attempt_at END,
	coalesce(lease_owner, ''), lease_expires_at, coalesce(provider_ref, ''), coalesce(last_error, ''),
	coalesce(resolved_by, ''), coalesce(resolution_note, ''), resolved_at,
	created_at, fired_at, confirmed_at, updated_at`

// takeExpiredFired ends refire and reconcile: it takes up to $4 fired rows
// of kinds $3 whose lease expired, oldest due first, and returns what a call
// needs. Their SET clauses say what taking over means.
const takeExpiredFired = `WHERE s.ctid = ANY(ARRAY(
	SELECT ctid FROM {schema}.side_effects
	WHERE state = 'fired' AND next_attempt_at <= now() AND lease_expires_at < now() AND kind = ANY($3)
	ORDER BY next_attempt_at
	LIMIT $4
	FOR UPDATE SKIP LOCKED))
RETURNING s.id, s.source_id, s.kind, s.payload, s.idempotency_key, s.attempts, s.created_at, s.trace`

// claimDue moves due pending rows to fired ($1 lease owner, $2 lease, $3
// kinds, $4 limit): its commit is the "fired" commit that precedes the
// calls. It changes no indexed column (next_attempt_at keeps the due time;
// no index refers to state), so each row's fired version is a HOT update on
// its own page, with no index entry (migration 007). The rows are found by
// their tuple ids: locked FOR UPDATE by the subquery, they stay the current
// versions until this statement updates them, and a TID scan saves a
// primary-key descent per row (about 10% of PostgreSQL's CPU per effect). A
// row that moved anyway is not updated, hence not returned, hence not
// called. The recovery statements below use the same form.
const claimDue = `UPDATE {schema}.side_effects s
SET state = 'fired', attempts = s.attempts + 1, lease_owner = $1,
	lease_expires_at = now() + $2::interval, fired_at = now(), updated_at = now()
WHERE s.ctid = ANY(ARRAY(
	SELECT ctid FROM {schema}.side_effects
	WHERE state = 'pending' AND next_attempt_at <= now() AND kind = ANY($3)
	ORDER BY next_attempt_at
	LIMIT $4
	FOR UPDATE SKIP LOCKED))
RETURNING s.id, s.source_id, s.kind, s.payload, s.idempotency_key, s.attempts, s.created_at, s.trace`

// completeOutcomes applies a batch of outcomes ($5..$10), fenced by the
// lease owner ($1) and the attempt that was fired, so a late result of a
// lost lease is dropped. "released" puts back a claimed row that was never
// called. A settled row (confirmed, failed) leaves the due index
// (next_attempt_at NULL); an unknown one waits at 'infinity'.
const completeOutcomes = `UPDATE {schema}.side_effects s
SET state = CASE WHEN v.state = 'released' THEN 'pending' ELSE v.state END,
	attempts = CASE WHEN v.state = 'released' THEN s.attempts - 1 ELSE s.attempts END,
	provider_ref = coalesce(v.ref, s.provider_ref),
	last_error = CASE WHEN v.state = 'released' THEN s.last_error ELSE v.err END,
	next_attempt_at = CASE WHEN v.state IN ('pending', 'released', 'fired')
		THEN now() + v.delay * interval '1 second' WHEN v.state = 'unknown' THEN 'infinity' END,
	lease_expires_at = CASE WHEN v.state = 'fired' THEN now() + v.delay * interval '1 second' END,
	lease_owner = NULL,
	confirmed_at = CASE WHEN v.state = 'confirmed' THEN now() ELSE s.confirmed_at END,
	updated_at = now()
FROM unnest($5::bigint[], $6::int[], $7::text[], $8::text[], $9::text[], $10::float8[])
	AS v(id, attempt, state, ref, err, delay)
WHERE s.id = v.id AND s.state = 'fired' AND s.lease_owner = $1 AND s.attempts = v.attempt
RETURNING s.kind, s.state, s.attempts, extract(epoch FROM now() - s.fired_at)::float8 AS fired_for`

func render(schema string) statements {
	r := func(s string) string { return pgsql.Render(s, schema) }
	return statements{
		insert: r(`INSERT INTO {schema}.side_effects (source_id, kind, payload, idempotency_key, trace)
VALUES ($1, $2, $3, $4, $5::jsonb)
ON CONFLICT (source_id, kind) DO NOTHING
RETURNING id, idempotency_key`),
		selectBySource: r(`SELECT id, idempotency_key FROM {schema}.side_effects WHERE source_id = $1 AND kind = $2`),

		// sync is one round of the dispatcher: it commits a batch of
		// outcomes and claims due rows, in one statement and one commit.
		// The two never touch the same row: outcomes apply to this
		// dispatcher's fired rows, claims take pending rows as of the
		// statement's snapshot (a row an outcome puts back to pending is
		// claimed in a later round). Claimed rows come first, flagged true.
		sync: r(`WITH outcomes AS (` + completeOutcomes + `), claimed AS (` + claimDue + `)
SELECT true, id, source_id, kind, payload, idempotency_key, attempts, created_at, trace, 'fired', 0::float8 FROM claimed
UNION ALL
SELECT false, 0, '', kind, '\x'::bytea, '', attempts, now(), NULL::jsonb, state, fired_for FROM outcomes`),

		// refire takes over fired rows whose lease expired, for providers
		// that honour keys: fired again, same key, attempts+1.
		refire: r(`UPDATE {schema}.side_effects s
SET attempts = s.attempts + 1, lease_owner = $1,
	lease_expires_at = now() + $2::interval, fired_at = now(), updated_at = now()
` + takeExpiredFired),

		// reconcile takes a lease on expired fired rows of providers that
		// offer a lookup; attempts is unchanged (nothing is fired).
		reconcile: r(`UPDATE {schema}.side_effects s
SET lease_owner = $1, lease_expires_at = now() + $2::interval, updated_at = now()
` + takeExpiredFired),

		// markUnknown gives up on expired fired rows of providers that
		// neither honour keys nor offer a lookup.
		markUnknown: r(`UPDATE {schema}.side_effects s
SET state = 'unknown', next_attempt_at = 'infinity', lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
	last_error = 'lease expired while fired: the dispatcher died mid-call and the provider neither honours keys nor offers a lookup'
WHERE s.ctid = ANY(ARRAY(
	SELECT ctid FROM {schema}.side_effects
	WHERE state = 'fired' AND next_attempt_at <= now() AND lease_expires_at < now() AND kind = ANY($1)
	LIMIT $2
	FOR UPDATE SKIP LOCKED))
RETURNING s.kind`),

		// countUnknown finds the unknown rows through the due index, where
		// they wait at 'infinity'.
		countUnknown: r(`SELECT kind, count(*) FROM {schema}.side_effects
WHERE next_attempt_at = 'infinity' AND state = 'unknown' GROUP BY kind`),

		// A retention pass (retention.PruneInTIDOrder) over the confirmed and
		// failed rows recorded before $1: the first and last of them, then
		// batches of up to $4 after tuple id $2 and up to $3, each deleted
		// by ctid, which spares a primary-key descent per row. One pass at
		// a time works on the table: a batch takes the ledger's advisory
		// lock or, when another pass holds it, looks at no row (that pass
		// deletes them). Rows are not locked one by one (that wrote a lock
		// into each before its deletion: decision 019); the DELETE checks
		// again that the row is one to delete, so a failed effect retried
		// meanwhile ('pending' again) stays.
		pruneBounds: r(`SELECT min(ctid), max(ctid) FROM {schema}.side_effects
WHERE state IN ('confirmed', 'failed') AND created_at < $1`),
		prune: r(`WITH pass AS (SELECT pg_try_advisory_xact_lock(hashtext('oncekit.sideeffect.prune:{schema}')) AS took),
batch AS (
	SELECT ctid FROM {schema}.side_effects
	WHERE (SELECT took FROM pass) AND ctid > $2 AND ctid <= $3 AND state IN ('confirmed', 'failed') AND created_at < $1
	LIMIT $4),
gone AS (DELETE FROM {schema}.side_effects
	WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch)) AND state IN ('confirmed', 'failed') AND created_at < $1
	RETURNING 1)
SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM gone), (SELECT max(ctid) FROM batch)`),

		list: r(`SELECT ` + rowColumns + ` FROM {schema}.side_effects
WHERE ($1 = '' OR state = $1) AND ($2 = '' OR kind = $2) AND id > $3
ORDER BY id LIMIT $4`),
		get: r(`SELECT ` + rowColumns + ` FROM {schema}.side_effects WHERE id = $1`),
		retry: r(`UPDATE {schema}.side_effects
SET state = 'pending', next_attempt_at = now(), lease_owner = NULL, lease_expires_at = NULL,
	resolved_by = $2, resolution_note = $3, resolved_at = now(), updated_at = now()
WHERE id = $1 AND state IN ('failed', 'unknown')
RETURNING state`),
		resolve: r(`UPDATE {schema}.side_effects
SET state = $2, resolved_by = $3, resolution_note = $4, resolved_at = now(), updated_at = now(),
	provider_ref = coalesce(nullif($5, ''), provider_ref),
	confirmed_at = CASE WHEN $2 = 'confirmed' THEN now() ELSE confirmed_at END,
	next_attempt_at = NULL
WHERE id = $1 AND state = 'unknown'
RETURNING state`),
	}
}
