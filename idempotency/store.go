package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// State is an idempotency record's state, as idempotency_keys.state holds
// it.
type State string

// The states of a record: claimed by a request that has not finished;
// holding its stored response; released by a request that ended without
// one (a 5xx, 429, 401 or 403, a panic), keeping its fingerprint so that
// the same body may run again and another is refused; or unknown, when the
// handler could not prove what its request did (Unknown) and a
// reconciliation (Route.UnknownOutcomes.Reconcile) or an operator (Edge.Resolve) must
// settle it.
const (
	StateInProgress State = "in_progress"
	StateCompleted  State = "completed"
	StateReleased   State = "released"
	StateUnknown    State = "unknown"
)

// recordID is a record's primary key, with the key as the client sent it;
// the table holds its digest (stored).
type recordID struct {
	tenant, operation, key string
	business               string // the request's business key as stored ("" for none)
}

// stored is the key as idempotency_keys holds it: a SHA-256 digest, so
// that a client's keys are never stored (or logged) as they were sent. The
// lookup stays exact. Migration 013 wrote the keys stored before it the
// same way: keep the two in step.
func (id recordID) stored() string { return StoredKey(id.key) }

// StoredKey is the form idempotency_keys.key holds a client's key in: the
// hex SHA-256 digest of "oncekit/idempotency/key/v1:" followed by the key.
// Use it to find a key's record by hand.
func StoredKey(key string) string {
	sum := sha256.Sum256([]byte("oncekit/idempotency/key/v1:" + key))
	return hex.EncodeToString(sum[:])
}

// operationID is the ID of the operation the key started (Info.ID), kept
// on the record so that a payment's ID leads to its key's record.
func (id recordID) operationID() uuid.UUID { return oncekit.DeriveID(id.tenant, id.key) }

// aad binds a sealed body to its record.
func (id recordID) aad() []byte {
	var b []byte
	for _, s := range []string{id.tenant, id.operation, id.key} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// record is a stored idempotency record as a later request sees it.
type record struct {
	fingerprint []byte
	state       State
	status      int
	headers     http.Header
	body        []byte
	sealed      bool
	age         time.Duration
	bodyExpired bool   // completed, and its response is past its lifetime (Route.TTL)
	version     int    // the route's ResponseVersions.Current when the response was stored
	reason      string // unknown: why
}

// statements is the edge's SQL, rendered for the schema once.
type statements struct {
	claim, claimTx, lookup, complete, completeTx, unknown, unknownTx, release, released, unclaim, renew, prune, purgeBodies string
	inProgress, unsettled, status, cleanupLag, claimBusinessKey, businessKeyHolder, pruneBusinessKeys, resolve, listUnknown string
	itemClaim, itemLookup, itemStore, completeItems                                                                         string
}

// claimSQL inserts a fresh in_progress record, or takes over (a) an
// in_progress record with the same fingerprint whose lease ran out (a
// recovery: token and recoveries go up, so the old owner is fenced out),
// (b) with $8 (the route reconciles), an unknown record with the same
// fingerprint, likewise, (c) a released record with the same fingerprint,
// or (d) a completed or released record past its expiry, or (e) with $7
// (Responses.RunExpiredRetries), a completed record whose response
// expired, under the same fingerprint: another body is still refused as a reuse. Anything else
// returns no row. The row lock ON CONFLICT takes makes the takeover happen
// for one request only. A recovery keeps the unknown's reason, so that the
// recovering request knows it takes over an unknown outcome.
const claimSQL = `
INSERT INTO {schema}.idempotency_keys AS k (tenant, operation, key, fingerprint, state, locked_until, expires_at, operation_id)
VALUES ($1, $2, $3, $4, 'in_progress', now() + $5 * interval '1 microsecond', now() + $6 * interval '1 microsecond', $9)
ON CONFLICT (tenant, operation, key) DO UPDATE SET
	fingerprint      = EXCLUDED.fingerprint,
	operation_id     = EXCLUDED.operation_id,
	problem_code     = NULL,
	locked_until     = EXCLUDED.locked_until,
	token            = k.token + 1,
	recoveries       = CASE WHEN k.state IN ('in_progress', 'unknown') THEN k.recoveries + 1 ELSE 0 END,
	created_at       = CASE WHEN k.state IN ('in_progress', 'unknown') THEN k.created_at ELSE now() END,
	unknown_reason   = CASE WHEN k.state IN ('in_progress', 'unknown') THEN k.unknown_reason END,
	state            = 'in_progress',
	status_code      = NULL,
	response_headers = NULL,
	response_body    = NULL,
	body_sealed      = false,
	completed_at     = NULL,
	body_expires_at  = NULL,
	expires_at       = EXCLUDED.expires_at
WHERE (k.state = 'in_progress' AND k.locked_until < now() AND k.fingerprint = EXCLUDED.fingerprint)
   OR ($8 AND k.state = 'unknown' AND k.fingerprint = EXCLUDED.fingerprint)
   OR (k.state = 'released' AND k.fingerprint = EXCLUDED.fingerprint)
   OR (k.state IN ('completed', 'released') AND k.expires_at <= now())
   OR ($7 AND k.state = 'completed' AND k.body_expires_at <= now() AND k.fingerprint = EXCLUDED.fingerprint)
RETURNING token, recoveries, coalesce(unknown_reason, ''), unknown_reason IS NOT NULL`

// claimTxSQL claims inside the handler's transaction, or returns the record
// that holds the key when it was committed before this statement began
// (the usual replay), in one round trip. No row at all means the holder
// committed while this statement waited for it: look it up afresh.
const claimTxSQL = `
WITH ins AS (
	INSERT INTO {schema}.idempotency_keys AS k (tenant, operation, key, fingerprint, state, expires_at, operation_id)
	VALUES ($1, $2, $3, $4, 'in_progress', now() + $5 * interval '1 microsecond', $7)
	ON CONFLICT (tenant, operation, key) DO UPDATE SET
		fingerprint = EXCLUDED.fingerprint, token = k.token + 1, recoveries = 0, created_at = now(),
		operation_id = EXCLUDED.operation_id, problem_code = NULL,
		state = 'in_progress', locked_until = NULL, status_code = NULL, response_headers = NULL,
		response_body = NULL, body_sealed = false, completed_at = NULL, body_expires_at = NULL,
		expires_at = EXCLUDED.expires_at, unknown_reason = NULL
	WHERE (k.state = 'released' AND k.fingerprint = EXCLUDED.fingerprint)
	   OR (k.state IN ('completed', 'released') AND k.expires_at <= now())
	   OR ($6 AND k.state = 'completed' AND k.body_expires_at <= now() AND k.fingerprint = EXCLUDED.fingerprint)
	RETURNING token
)
SELECT true, token, NULL::bytea, NULL::text, NULL::integer, NULL::jsonb, NULL::bytea, false, 0::float8, false, 0, '' FROM ins
UNION ALL
SELECT false, token, ` + recordColumns + `
FROM {schema}.idempotency_keys
WHERE tenant = $1 AND operation = $2 AND key = $3 AND NOT EXISTS (SELECT FROM ins)`

// recordColumns are the columns scanRecord reads.
const recordColumns = `fingerprint, state, status_code, response_headers, response_body, body_sealed,
	extract(epoch FROM now() - created_at)::float8, coalesce(body_expires_at <= now(), false),
	response_version, coalesce(unknown_reason, '')`

// unsettled is the condition of a record waiting for an outcome, as the
// idempotency_keys_unsettled index states it (a committed in-progress
// record always has its lease).
const unsettled = `(state = 'unknown' OR (state = 'in_progress' AND locked_until IS NOT NULL))`

// live is the condition of a record that still holds its key: unsettled
// (whatever its age), or not yet expired.
const live = `(state IN ('in_progress', 'unknown') OR expires_at > now())`

const lookupSQL = `
SELECT ` + recordColumns + `
FROM {schema}.idempotency_keys
WHERE tenant = $1 AND operation = $2 AND key = $3 AND ` + live

// completeCTEs store the response ($5–$8, lifetimes $9 and $10, version
// $11, problem code $13) under the claim's token and, for a route with
// business keys, the resource's location ($12, ” for none) on the key's
// business key. u has a row when the claim was still there to complete.
const completeCTEs = `
WITH bk AS (
	UPDATE {schema}.idempotency_business_keys SET location = $12
	WHERE $12 <> '' AND tenant = $1 AND operation = $2 AND key = $3),
u AS (
	UPDATE {schema}.idempotency_keys SET
		state = 'completed', status_code = $5, response_headers = $6, response_body = $7, body_sealed = $8,
		completed_at = now(), expires_at = now() + $9 * interval '1 microsecond', locked_until = NULL,
		body_expires_at = now() + $10 * interval '1 microsecond', response_version = $11, problem_code = $13
	WHERE tenant = $1 AND operation = $2 AND key = $3 AND token = $4 AND state = 'in_progress'
	RETURNING 1)`

// completeSQL stores the response and returns 1, or 0 when the claim was
// taken over (fenced).
const completeSQL = completeCTEs + `
SELECT count(*) FROM u`

// completeTxSQL stores the response inside the handler's transaction and
// fails (division by zero) when the claim row is not there to update, so the
// COMMIT pipelined behind it turns into a rollback instead of committing the
// handler's writes without their stored response.
const completeTxSQL = completeCTEs + `
SELECT 1 / count(*) FROM u`

// unknownSQL settles a claim as unknown, with why ($5), until an operator
// or a reconciliation decides; it returns 1, or 0 when fenced.
const unknownSQL = `
WITH u AS (
	UPDATE {schema}.idempotency_keys SET state = 'unknown', unknown_reason = $5, locked_until = NULL,
		completed_at = now(), expires_at = now() + $6 * interval '1 microsecond'
	WHERE tenant = $1 AND operation = $2 AND key = $3 AND token = $4 AND state = 'in_progress'
	RETURNING 1)`

// unknownTxSQL is unknownSQL in the handler's transaction, failing when the
// claim is not there (as completeTxSQL).
const unknownTxSQL = unknownSQL + `
SELECT 1 / count(*) FROM u`

// releaseSQL keeps a claim whose request ended without a stored response
// as released, with its fingerprint and its answer's problem code ($7),
// until $5 (microseconds) from now, and frees the business key it took, if
// any: the operation did not happen.
const releaseSQL = `
WITH bk AS (
	DELETE FROM {schema}.idempotency_business_keys
	WHERE $6 AND tenant = $1 AND operation = $2 AND key = $3)
UPDATE {schema}.idempotency_keys SET state = 'released', locked_until = NULL,
	expires_at = now() + $5 * interval '1 microsecond', problem_code = $7
WHERE tenant = $1 AND operation = $2 AND key = $3 AND token = $4 AND state = 'in_progress'`

// purgeBodiesSQL empties up to $1 completed records' response bodies past
// their lifetime (body_expires_at), keeping the key's meaning (status,
// headers with the resource's Location) until expires_at, and returns how
// many it emptied.
const purgeBodiesSQL = `
WITH emptied AS (
	UPDATE {schema}.idempotency_keys SET response_body = NULL
	WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM {schema}.idempotency_keys
		WHERE response_body IS NOT NULL AND body_expires_at <= now()
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	RETURNING 1)
SELECT count(*) FROM emptied`

// cleanupLagSQL is how long the oldest expired record has waited for
// deletion, in seconds (0: none); the expiry index answers it.
const cleanupLagSQL = `
SELECT coalesce(extract(epoch FROM now() - min(expires_at)), 0)::float8
FROM {schema}.idempotency_keys WHERE state IN ('completed', 'released') AND expires_at <= now()`

// unclaimSQL drops a fresh claim that is not to run (rate-limited).
const unclaimSQL = `
DELETE FROM {schema}.idempotency_keys
WHERE tenant = $1 AND operation = $2 AND key = $3 AND token = $4 AND state = 'in_progress'`

// releasedSQL records, after a same-transaction request rolled back
// without a stored response, that its key was used with its fingerprint
// (with its answer's problem code $6 and the operation's ID $7): unless
// another request holds the key by now (or the key was released before
// this request claimed it, which the rollback restored).
const releasedSQL = `
INSERT INTO {schema}.idempotency_keys (tenant, operation, key, fingerprint, state, expires_at, problem_code, operation_id)
VALUES ($1, $2, $3, $4, 'released', now() + $5 * interval '1 microsecond', $6, $7)
ON CONFLICT (tenant, operation, key) DO NOTHING`

const renewSQL = `
UPDATE {schema}.idempotency_keys SET locked_until = now() + $5 * interval '1 microsecond'
WHERE tenant = $1 AND operation = $2 AND key = $3 AND token = $4 AND state = 'in_progress'`

// pruneSQL deletes up to $1 expired completed records, the oldest first
// from $2 on (the expiry of the last record the previous batch of the pass
// deleted), and returns how many it deleted and the last one's expiry.
// Starting each batch from the oldest record instead walked the index
// entries of every record the pass had deleted so far (dead until vacuum),
// which made a pass quadratic in the records it deleted. The rows are
// deleted by ctid (locked by the same statement, so it cannot change),
// which spares a primary-key descent per row. The batch commits without
// waiting for its WAL to reach the disk (decision 022): a crash may undo
// the last batches, whose records the next pass deletes again.
const pruneSQL = `
WITH gone AS (
	DELETE FROM {schema}.idempotency_keys
	WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM {schema}.idempotency_keys
		WHERE state IN ('completed', 'released') AND expires_at <= now() AND expires_at >= $2
		ORDER BY expires_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	AND state IN ('completed', 'released') AND expires_at <= now()
	RETURNING expires_at),
async AS (SELECT set_config('synchronous_commit', 'off', true))
SELECT count(*), coalesce(max(expires_at), $2) FROM gone, async`

const inProgressSQL = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM {schema}.idempotency_keys WHERE state = 'in_progress'`

// unsettledSQL counts the records waiting for an outcome (in progress or
// unknown) and their oldest's age, per operation and state, on the
// idempotency_keys_unsettled index.
const unsettledSQL = `
SELECT operation, state, count(*), extract(epoch FROM now() - min(created_at))::float8
FROM {schema}.idempotency_keys WHERE ` + unsettled + `
GROUP BY operation, state`

func renderStatements(schema string) statements {
	return statements{
		claim:       pgsql.Render(claimSQL, schema),
		claimTx:     pgsql.Render(claimTxSQL, schema),
		lookup:      pgsql.Render(lookupSQL, schema),
		complete:    pgsql.Render(completeSQL, schema),
		completeTx:  pgsql.Render(completeTxSQL, schema),
		unknown:     pgsql.Render(unknownSQL+`SELECT count(*) FROM u`, schema),
		unknownTx:   pgsql.Render(unknownTxSQL, schema),
		release:     pgsql.Render(releaseSQL, schema),
		released:    pgsql.Render(releasedSQL, schema),
		unclaim:     pgsql.Render(unclaimSQL, schema),
		purgeBodies: pgsql.Render(purgeBodiesSQL, schema),
		renew:       pgsql.Render(renewSQL, schema),
		prune:       pgsql.Render(pruneSQL, schema),
		inProgress:  pgsql.Render(inProgressSQL, schema),
		unsettled:   pgsql.Render(unsettledSQL, schema),
		status:      pgsql.Render(statusSQL, schema),
		cleanupLag:  pgsql.Render(cleanupLagSQL, schema),

		claimBusinessKey:  pgsql.Render(claimBusinessKeySQL, schema),
		businessKeyHolder: pgsql.Render(businessKeyHolderSQL, schema),
		pruneBusinessKeys: pgsql.Render(pruneBusinessKeysSQL, schema),
		resolve:           pgsql.Render(resolveSQL, schema),
		itemClaim:         pgsql.Render(itemClaimSQL, schema),
		itemLookup:        pgsql.Render(itemLookupSQL, schema),
		itemStore:         pgsql.Render(itemStoreSQL, schema),
		completeItems:     pgsql.Render(completeItemsSQL, schema),
		listUnknown:       pgsql.Render(listUnknownSQL, schema),
	}
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// scanRecord fills a record from recordColumns.
func scanRecord(row pgx.Row, rec *record) error {
	var status *int32
	var headers []byte
	var age float64
	if err := row.Scan(rec.dest(&status, &headers, &age)...); err != nil {
		return err
	}
	return rec.fill(status, headers, age)
}

// dest lists where recordColumns scan to.
func (rec *record) dest(status **int32, headers *[]byte, age *float64) []any {
	return []any{&rec.fingerprint, &rec.state, status, headers, &rec.body, &rec.sealed, age, &rec.bodyExpired, &rec.version, &rec.reason}
}

func (rec *record) fill(status *int32, headers []byte, age float64) error {
	if status != nil {
		rec.status = int(*status)
	}
	rec.age = time.Duration(age * float64(time.Second))
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &rec.headers); err != nil {
			return fmt.Errorf("idempotency: stored headers: %w", err)
		}
	}
	return nil
}

// lookup reads the live record for id; found is false when there is none
// (never claimed, released, or expired).
func (e *Edge) lookup(ctx context.Context, id recordID) (rec record, found bool, err error) {
	return e.lookupStored(ctx, id.tenant, id.operation, id.stored())
}

// replicated returns rec, a record about to be replayed, once it is sure
// to survive a failover: with synchronous standbys, a completed record can
// be visible on the primary before the standby has it (its commit's wait
// was cancelled), and replaying it would tell a client that a request
// succeeded whose effects a failover then erases. The record is read again
// in a transaction whose commit waits for the standbys
// (pgsql.SyncBarrierSQL), on one connection. found is false when it is
// gone meanwhile.
func (e *Edge) replicated(ctx context.Context, id recordID, rec *record) (_ *record, found bool, err error) {
	if rec.state != StateCompleted || !e.syncStandbys.On(ctx, e.db) {
		return rec, true, nil
	}
	tx, err := e.db.Begin(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: lookup: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var got record
	err = scanRecord(tx.QueryRow(ctx, e.sql.lookup, id.tenant, id.operation, id.stored()), &got)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: lookup: %w", err)
	}
	if _, err := tx.Exec(ctx, pgsql.SyncBarrierSQL); err != nil {
		return nil, false, fmt.Errorf("idempotency: wait for the synchronous standby: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, fmt.Errorf("idempotency: wait for the synchronous standby: %w", err)
	}
	return &got, true, nil
}

// lookupStored is lookup by the key's stored form.
func (e *Edge) lookupStored(ctx context.Context, tenant, operation, stored string) (rec record, found bool, err error) {
	err = scanRecord(e.db.QueryRow(ctx, e.sql.lookup, tenant, operation, stored), &rec)
	if errors.Is(err, pgx.ErrNoRows) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("idempotency: lookup: %w", err)
	}
	return rec, true, nil
}
