package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// The reads operators' tools compose (oncekit status, the console, drift)
// over processed_messages and dead_letters: the inbox package is the one
// place that says what their rows mean. Each takes the querier to run on,
// so that a caller's figures can come from one transaction, and reads
// through an index or under a limit.

// ConsumerActivity is a consumer's recent claims and its dead letters
// waiting for a replay.
type ConsumerActivity struct {
	Consumer string
	// ClaimsLastHour counts the claims of the last hour.
	ClaimsLastHour int64
	// DeadLetters counts the dead letters not yet replayed, and
	// OldestDeadAge is the age of the oldest of them.
	DeadLetters   int64
	OldestDeadAge time.Duration
}

// activitySQL reads the claims of the last hour (a range of the BRIN index
// on processed_at) and the waiting dead letters.
const activitySQL = `WITH claims AS (
		SELECT consumer, count(*) AS n FROM {schema}.processed_messages
		WHERE processed_at >= now() - interval '1 hour' GROUP BY consumer),
	dead AS (
		SELECT consumer, count(*) AS n, extract(epoch FROM now() - min(created_at))::float8 AS oldest
		FROM {schema}.dead_letters WHERE replayed_at IS NULL GROUP BY consumer)
	SELECT coalesce(c.consumer, d.consumer), coalesce(c.n, 0), coalesce(d.n, 0), coalesce(d.oldest, 0)
	FROM claims c FULL JOIN dead d ON d.consumer = c.consumer
	ORDER BY 1 LIMIT $1`

// Activity lists up to limit consumers, by name, with claims in the last
// hour or dead letters waiting.
func (s *Store) Activity(ctx context.Context, q oncekit.Querier, limit int) ([]ConsumerActivity, error) {
	rows, err := q.Query(ctx, pgsql.Render(activitySQL, s.schema), limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: activity: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerActivity, error) {
		var c ConsumerActivity
		var oldest float64
		err := r.Scan(&c.Consumer, &c.ClaimsLastHour, &c.DeadLetters, &oldest)
		c.OldestDeadAge = time.Duration(oldest * float64(time.Second))
		return c, err
	})
}

// ClaimsAround says whether consumer holds claims made within age, and
// claims older than age: two range reads of the BRIN index on
// processed_at.
func (s *Store) ClaimsAround(ctx context.Context, q oncekit.Querier, consumer string, age time.Duration) (newer, older bool, err error) {
	err = q.QueryRow(ctx, pgsql.Render(`SELECT
		EXISTS (SELECT 1 FROM {schema}.processed_messages
			WHERE processed_at >= now() - make_interval(secs => $2) AND consumer = $1),
		EXISTS (SELECT 1 FROM {schema}.processed_messages
			WHERE processed_at < now() - make_interval(secs => $2) AND consumer = $1)`, s.schema),
		consumer, age.Seconds()).Scan(&newer, &older)
	if err != nil {
		return false, false, fmt.Errorf("inbox: claims of %s: %w", consumer, err)
	}
	return newer, older, nil
}

// Claim is a consumer's claim of a message.
type Claim struct {
	MessageID   string
	Consumer    string
	ProcessedAt time.Time
}

// Claims reads the claims of the messages ids (the primary key), up to
// limit, the oldest first.
func (s *Store) Claims(ctx context.Context, q oncekit.Querier, ids []uuid.UUID, limit int) ([]Claim, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT p.message_id::text, p.consumer, p.processed_at
		FROM {schema}.processed_messages p WHERE p.message_id = ANY($1::uuid[]) ORDER BY p.processed_at LIMIT $2`, s.schema),
		pgsql.UUIDs(ids), limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: claims: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Claim])
}

// DeadLetterSummary is a dead letter without its message's payload and
// headers.
type DeadLetterSummary struct {
	ID         int64
	Consumer   string
	MessageID  string
	Subject    string
	Reason     string // its first 200 characters
	Attempts   int
	CreatedAt  time.Time
	ReplayedAt *time.Time
}

const summaryColumns = `d.id, d.consumer, d.message_id, d.subject, left(d.reason, 200), d.attempts, d.created_at, d.replayed_at`

// DeadLettersOf reads the dead letters of the messages ids (as delivered:
// dead_letters_message_id), up to limit, in ID order.
func (s *Store) DeadLettersOf(ctx context.Context, q oncekit.Querier, ids []string, limit int) ([]DeadLetterSummary, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT `+summaryColumns+`
		FROM {schema}.dead_letters d WHERE d.message_id = ANY($1::text[]) ORDER BY d.id LIMIT $2`, s.schema), ids, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: dead letters of messages: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetterSummary])
}

// Waiting lists up to limit dead letters not yet replayed, in ID order,
// and counts them all.
func (s *Store) Waiting(ctx context.Context, q oncekit.Querier, limit int) ([]DeadLetterSummary, int64, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT `+summaryColumns+`, count(*) OVER ()
		FROM {schema}.dead_letters d WHERE d.replayed_at IS NULL ORDER BY d.id LIMIT $1`, s.schema), limit)
	if err != nil {
		return nil, 0, fmt.Errorf("inbox: waiting dead letters: %w", err)
	}
	var total int64
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterSummary, error) {
		var d DeadLetterSummary
		err := r.Scan(&d.ID, &d.Consumer, &d.MessageID, &d.Subject, &d.Reason, &d.Attempts, &d.CreatedAt, &d.ReplayedAt, &total)
		return d, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("inbox: waiting dead letters: %w", err)
	}
	return out, total, nil
}

// MessagesInTrace returns the message IDs of up to limit dead letters
// whose delivery carried the W3C trace ID trace (32 hex digits), through
// the index dead_letters_trace_id (migration 017).
func (s *Store) MessagesInTrace(ctx context.Context, q oncekit.Querier, trace string, limit int) ([]string, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT d.message_id FROM {schema}.dead_letters d
		WHERE substr(coalesce(d.headers->'traceparent'->>0, d.headers->'Traceparent'->>0), 4, 32) = $1 LIMIT $2`, s.schema),
		trace, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: dead letters in trace: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// DeadLetterGroup is the waiting dead letters of one consumer with one
// error: their reasons alike once digits (IDs, counts, offsets) are taken
// out.
type DeadLetterGroup struct {
	Consumer string
	// Fingerprint names the group (DeadLettersInGroup).
	Fingerprint string
	Count       int64
	First, Last time.Time
	// Example is the ID of the group's first dead letter, Reason the
	// first 200 characters of the least of their reasons.
	Example int64
	Reason  string
}

// fingerprintExpr groups dead letters by consumer and error, digits taken
// out.
const fingerprintExpr = `left(md5(d.consumer || ':' || regexp_replace(left(d.reason, 300), '[0-9]+', 'N', 'g')), 16)`

// deadGroupsSQL groups the latest 10,000 waiting dead letters, read
// backwards on dead_letters_created_at, so that a grouping costs the same
// whatever the table holds.
const deadGroupsSQL = `
WITH latest AS (
	SELECT d.id, d.consumer, d.reason, d.created_at FROM {schema}.dead_letters d
	WHERE d.replayed_at IS NULL
	ORDER BY d.created_at DESC LIMIT 10000)
SELECT d.consumer, ` + fingerprintExpr + ` AS fp, count(*), min(d.created_at), max(d.created_at), min(d.id),
	left(min(d.reason), 200)
FROM latest d GROUP BY 1, 2 ORDER BY count(*) DESC, 2 LIMIT $1`

const deadInGroupSQL = `
WITH latest AS (
	SELECT d.id, d.consumer, d.reason, d.message_id, d.created_at FROM {schema}.dead_letters d
	WHERE d.replayed_at IS NULL
	ORDER BY d.created_at DESC LIMIT 10000)
SELECT d.id, d.message_id, d.created_at FROM latest d
WHERE d.consumer = $1 AND ` + fingerprintExpr + ` = $2 ORDER BY d.id LIMIT $3`

// DeadLetterGroups groups the latest 10,000 waiting dead letters and
// returns up to limit groups, the largest first.
func (s *Store) DeadLetterGroups(ctx context.Context, q oncekit.Querier, limit int) ([]DeadLetterGroup, error) {
	rows, err := q.Query(ctx, pgsql.Render(deadGroupsSQL, s.schema), limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: dead letter groups: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetterGroup])
}

// GroupMember is a dead letter of a DeadLetterGroup.
type GroupMember struct {
	ID        int64
	MessageID string
	CreatedAt time.Time
}

// DeadLettersInGroup lists up to limit dead letters of consumer's group
// fingerprint, among the same window as DeadLetterGroups, in ID order.
func (s *Store) DeadLettersInGroup(ctx context.Context, q oncekit.Querier, consumer, fingerprint string, limit int) ([]GroupMember, error) {
	rows, err := q.Query(ctx, pgsql.Render(deadInGroupSQL, s.schema), consumer, fingerprint, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: dead letters in group: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[GroupMember])
}
