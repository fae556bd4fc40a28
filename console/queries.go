package console

import (
	"fmt"

	"github.com/oncekit/oncekit/internal/untrusted"
	"github.com/oncekit/oncekit/report"
)

// statements is the console's own SQL, rendered for the schema once. Every
// statement reads through an index, under a limit.
type statements struct {
	deadGroups, deadInGroup, overdue, unknownEffects, audit, insertAudit                 string
	chainEdge, chainOutbox, chainClaims, chainDead, chainEffects, chainTrace, edgeRecord string
}

// fingerprintExpr groups dead letters by consumer and error, digits taken
// out (IDs, counts, offsets), so that one error with different numbers is
// one group.
const fingerprintExpr = `left(md5(d.consumer || ':' || regexp_replace(left(d.reason, 300), '[0-9]+', 'N', 'g')), 16)`

// deadGroupsSQL groups the latest 10,000 dead letters waiting for a
// replay (read backwards on dead_letters_created_at), so that the inbox
// page costs the same whatever the table holds.
const deadGroupsSQL = `
WITH latest AS (
	SELECT d.id, d.consumer, d.reason, d.created_at FROM {schema}.dead_letters d
	WHERE d.replayed_at IS NULL
	ORDER BY d.created_at DESC LIMIT 10000)
SELECT d.consumer, ` + fingerprintExpr + ` AS fp, count(*), min(d.created_at), max(d.created_at), min(d.id),
	left(min(d.reason), 200)
FROM latest d GROUP BY 1, 2 ORDER BY count(*) DESC, 2 LIMIT $1`

// deadInGroupSQL lists the waiting dead letters of a group (consumer $1,
// fingerprint $2) among the same window, for a dry run and a replay.
const deadInGroupSQL = `
WITH latest AS (
	SELECT d.id, d.consumer, d.reason, d.message_id, d.created_at FROM {schema}.dead_letters d
	WHERE d.replayed_at IS NULL
	ORDER BY d.created_at DESC LIMIT 10000)
SELECT d.id, d.message_id, d.created_at FROM latest d
WHERE d.consumer = $1 AND ` + fingerprintExpr + ` = $2 ORDER BY d.id LIMIT $3`

// overdueSQL lists pending effects past due by $1 seconds, on the due
// index.
const overdueSQL = `
SELECT e.id, e.kind, e.source_id, e.attempts, e.next_attempt_at, coalesce(e.last_error, '')
FROM {schema}.side_effects e
WHERE e.next_attempt_at IS NOT NULL AND e.next_attempt_at < now() - make_interval(secs => $1) AND e.state = 'pending'
ORDER BY e.next_attempt_at LIMIT $2`

// unknownEffectsSQL lists unknown effects after the ID $1, in ID order:
// they wait in the due index at 'infinity', which orders them by ID
// (migration 018), so a page reads a page's worth however many wait. An
// index of their own would name state in its predicate and end the claims'
// HOT updates (decision 014).
const unknownEffectsSQL = `
SELECT e.id, e.kind, e.source_id, e.attempts, coalesce(e.last_error, ''), e.idempotency_key
FROM {schema}.side_effects e WHERE e.next_attempt_at = 'infinity' AND e.state = 'unknown' AND e.id > $1
ORDER BY e.id LIMIT $2`

// auditSQL lists the entries before the ID $1, the newest first.
const auditSQL = `
SELECT id, at, operator, action, target, count, note FROM {schema}.console_audit
WHERE id < $1 ORDER BY id DESC LIMIT $2`

const insertAuditSQL = `
INSERT INTO {schema}.console_audit (operator, action, target, count, note) VALUES ($1, $2, $3, $4, $5)`

// chainEdgeSQL reads an edge record by its primary key.
const chainEdgeSQL = `
SELECT k.state, coalesce(k.status_code, 0), k.created_at, k.completed_at, k.expires_at, k.token, k.recoveries,
	coalesce(k.unknown_reason, ''), coalesce(k.resolved_by, '')
FROM {schema}.idempotency_keys k WHERE k.tenant = $1 AND k.operation = $2 AND k.key = $3`

// chainOutboxSQL reads events by ID (outbox_id_key).
// A row is published once its partition's cursor passed it and it is not
// held (waiting for a retry, or parked).
const chainOutboxSQL = `
SELECT o.seq, o.id, o.partition, o.ordering_key, o.subject, o.attempts, o.created_at,
	o.parked_at IS NOT NULL, coalesce(o.last_error, ''),
	(o.txid, o.seq) <= (coalesce(p.cursor_txid, '2'), coalesce(p.cursor_seq, 0))
		AND o.parked_at IS NULL AND o.next_attempt_at IS NULL
FROM {schema}.outbox o LEFT JOIN {schema}.relay_partitions p ON p.partition = o.partition
WHERE o.id = ANY($1::uuid[]) ORDER BY o.seq LIMIT 100`

// chainClaimsSQL reads the inbox's claims of messages (the primary key
// (message_id, consumer)).
const chainClaimsSQL = `
SELECT p.message_id::text, p.consumer, p.processed_at
FROM {schema}.processed_messages p WHERE p.message_id = ANY($1::uuid[]) ORDER BY p.processed_at LIMIT 100`

// chainDeadSQL reads dead letters by message ID (dead_letters_message_id).
const chainDeadSQL = `
SELECT d.id, d.consumer, d.message_id, d.subject, left(d.reason, 200), d.attempts, d.created_at, d.replayed_at
FROM {schema}.dead_letters d WHERE d.message_id = ANY($1::text[]) ORDER BY d.id LIMIT 100`

// chainEffectsSQL reads effects by source ID (side_effects_source_kind_key)
// or by their idempotency key (side_effects_idempotency_key).
const chainEffectsSQL = `
SELECT e.id, e.kind, e.source_id, e.state, e.attempts, e.idempotency_key, coalesce(e.provider_ref, ''),
	coalesce(e.last_error, ''), e.created_at, e.updated_at
FROM {schema}.side_effects e WHERE e.source_id = ANY($1::text[])
UNION
SELECT e.id, e.kind, e.source_id, e.state, e.attempts, e.idempotency_key, coalesce(e.provider_ref, ''),
	coalesce(e.last_error, ''), e.created_at, e.updated_at
FROM {schema}.side_effects e WHERE e.idempotency_key = $2
ORDER BY 1 LIMIT 100`

// chainTraceSQL finds what a W3C trace ID ($1) leads to: the source IDs of
// the effects recorded in it (side_effects_trace_id) and the message IDs of
// its dead letters (dead_letters_trace_id), migration 017. The expressions
// are the indexes' own.
const chainTraceSQL = `
(SELECT 'effect' AS found, e.source_id AS id FROM {schema}.side_effects e
	WHERE e.trace IS NOT NULL AND substr(e.trace->>'traceparent', 4, 32) = $1 LIMIT 20)
UNION
(SELECT 'dead letter', d.message_id FROM {schema}.dead_letters d
	WHERE substr(coalesce(d.headers->'traceparent'->>0, d.headers->'Traceparent'->>0), 4, 32) = $1 LIMIT 20)`

// edgeRecordSQL reads one edge record, its stored response included, by
// its primary key.
const edgeRecordSQL = `
SELECT k.state, coalesce(k.status_code, 0), coalesce(k.response_headers::text, ''), k.response_body, k.body_sealed,
	k.created_at, k.completed_at, k.expires_at, coalesce(k.unknown_reason, ''), coalesce(k.resolved_by, ''),
	coalesce(k.resolution_note, '')
FROM {schema}.idempotency_keys k WHERE k.tenant = $1 AND k.operation = $2 AND k.key = $3`

// printable is s as the console shows text from outside: control
// characters and invalid UTF-8 escaped.
func printable(s string) string { return untrusted.Printable(s) }

// iecBytes formats a byte count (an int64 or a *int64; nil is "no limit")
// in its largest binary unit.
func iecBytes(v any) string {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case *int64:
		if x == nil {
			return "no limit"
		}
		n = *x
	}
	return report.BytesIEC(n)
}

// optionalSeconds formats a figure in seconds that may be unknown (nil).
func optionalSeconds(v *float64) string {
	if v == nil {
		return "unknown"
	}
	return fmt.Sprintf("%.0f s", *v)
}
