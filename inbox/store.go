package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/retention"
)

// Store holds the inbox's SQL for one schema: claims in processed_messages
// and rows of dead_letters. Every method takes the querier to run on, so
// claims and dead letters can ride in the caller's transaction. It is what
// the Consumer, the watermill middleware and `oncekit dlq` share.
type Store struct {
	schema                                                     string
	claim, claimBatch, claimNew, claimNewAll, unclaim, settled string
	insertDead, listDead, getDead, markReplayed                string
	pruneClaimBounds, pruneClaim, pruneDead, pruneReplayedDead string
}

// NewStore renders the inbox's SQL for schema ("" means "oncekit").
func NewStore(schema string) (*Store, error) {
	s, err := pgsql.ValidateSchema(schema)
	if err != nil {
		return nil, err
	}
	return renderStore(s), nil
}

// renderStore renders the inbox's SQL for schema, a name ValidateSchema
// accepted.
func renderStore(schema string) *Store {
	r := func(q string) string { return pgsql.Render(q, schema) }
	return &Store{
		schema: schema,
		claim:  r(`INSERT INTO {schema}.processed_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`),
		claimBatch: r(`INSERT INTO {schema}.processed_messages (consumer, message_id)
			SELECT $1, id FROM unnest($2::uuid[]) AS t(id)
			ON CONFLICT DO NOTHING RETURNING message_id`),
		claimNew: r(`INSERT INTO {schema}.processed_messages (consumer, message_id) VALUES ($1, $2)`),
		claimNewAll: r(`INSERT INTO {schema}.processed_messages (consumer, message_id)
			SELECT $1, id FROM unnest($2::uuid[]) AS t(id)`),
		unclaim: r(`DELETE FROM {schema}.processed_messages WHERE consumer = $1 AND message_id = ANY($2::uuid[])`),
		insertDead: r(`INSERT INTO {schema}.dead_letters (consumer, message_id, subject, payload, headers, reason, attempts,
				raw_message_id, raw_subject, raw_headers)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
			ON CONFLICT (consumer, message_id) WHERE replayed_at IS NULL AND message_id <> '' DO NOTHING`),
		listDead: r(`SELECT id, consumer, message_id, subject, payload, headers, reason, attempts, created_at, replayed_at, raw_message_id, raw_subject, raw_headers
			FROM {schema}.dead_letters
			WHERE ($1 = '' OR consumer = $1) AND ($2 OR replayed_at IS NULL)
			ORDER BY id LIMIT $3`),
		getDead: r(`SELECT id, consumer, message_id, subject, payload, headers, reason, attempts, created_at, replayed_at, raw_message_id, raw_subject, raw_headers
			FROM {schema}.dead_letters WHERE id = $1`),
		markReplayed: r(`UPDATE {schema}.dead_letters SET replayed_at = now() WHERE id = $1 AND replayed_at IS NULL
			RETURNING id, consumer, message_id, subject, payload, headers, reason, attempts, created_at, replayed_at, raw_message_id, raw_subject, raw_headers`),
		pruneDead: r(`DELETE FROM {schema}.dead_letters WHERE id = ANY(ARRAY(
			SELECT id FROM {schema}.dead_letters
			WHERE ($1 = '' OR consumer = $1) AND ($2::bigint = 0 OR id = $2) AND created_at < $3 AND (NOT $4 OR replayed_at IS NOT NULL)
			LIMIT $5))`),
		// A dead letter is replayed after it was created: the created_at
		// index narrows the rows looked at.
		pruneReplayedDead: r(`DELETE FROM {schema}.dead_letters WHERE id = ANY(ARRAY(
			SELECT id FROM {schema}.dead_letters
			WHERE created_at < $2 AND replayed_at < $2 AND consumer = $1 LIMIT $3))`),
		settled: r(`SELECT message_id::text FROM {schema}.processed_messages WHERE consumer = $1 AND message_id = ANY($2::uuid[])
			UNION ALL
			SELECT message_id FROM {schema}.dead_letters WHERE consumer = $1 AND message_id = ANY($3::text[]) AND replayed_at IS NULL`),
		// A retention pass (retention.PruneInTIDOrder) over consumer $1's
		// claims processed before $2: the first and last of them, then
		// batches of up to $5 after tuple id $3 and up to $4, each deleted
		// by ctid. One pass at a time works on a consumer's claims: a batch
		// takes the consumer's advisory lock or, when another pass holds
		// it, looks at no claim (that pass deletes them). Claims are not
		// locked one by one (that wrote a lock into each before its
		// deletion: decision 019); nothing updates a claim, and the DELETE
		// checks again that the row is one to delete.
		pruneClaimBounds: r(`SELECT min(ctid), max(ctid) FROM {schema}.processed_messages
			WHERE consumer = $1 AND processed_at < $2`),
		pruneClaim: r(`WITH pass AS (
				SELECT pg_try_advisory_xact_lock(hashtext('oncekit.inbox.prune:{schema}'), hashtext($1)) AS took),
			batch AS (
				SELECT ctid FROM {schema}.processed_messages
				WHERE (SELECT took FROM pass) AND ctid > $3 AND ctid <= $4 AND consumer = $1 AND processed_at < $2
				LIMIT $5),
			gone AS (DELETE FROM {schema}.processed_messages
				WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch)) AND consumer = $1 AND processed_at < $2
				RETURNING 1)
			SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM gone), (SELECT max(ctid) FROM batch)`),
	}
}

// Claim records that consumer processed message id, in tx. It reports false
// when the claim already existed (committed by an earlier delivery): the
// message is a duplicate. A concurrent uncommitted claim of the same message
// makes Claim wait for that transaction's outcome.
func (s *Store) Claim(ctx context.Context, tx oncekit.Querier, consumer string, id uuid.UUID) (bool, error) {
	tag, err := tx.Exec(ctx, s.claim, consumer, pgsql.UUID(id))
	if err != nil {
		return false, fmt.Errorf("inbox: claim: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// queueClaims queues the claim of ids (one or many) on b and returns the
// function that reads its result from the sent batch: the claims of a
// batch's messages, in one statement, whether the batch is pipelined with
// its BEGIN or sent in the transaction. Many IDs are sorted (unnest keeps
// array order), so two batches sharing messages lock them in the same order
// and cannot deadlock on each other's claims. With expectNew the
// claim is a plain INSERT, cheaper than ON CONFLICT's speculative insertion,
// that fails with a unique violation (aborting the transaction) if any ID is
// already claimed; the caller then starts over without expectNew.
func (s *Store) queueClaims(b *pgx.Batch, consumer string, ids []uuid.UUID, expectNew bool) func(pgx.BatchResults) (map[uuid.UUID]bool, error) {
	one, many := s.claim, s.claimBatch
	if expectNew {
		one = s.claimNew
	}
	if len(ids) == 1 {
		b.Queue(one, consumer, pgsql.UUID(ids[0]))
		return func(br pgx.BatchResults) (map[uuid.UUID]bool, error) {
			tag, err := br.Exec()
			if err != nil {
				return nil, fmt.Errorf("inbox: claim: %w", err)
			}
			return map[uuid.UUID]bool{ids[0]: tag.RowsAffected() == 1}, nil
		}
	}
	sorted := sortedArgs(ids)
	if expectNew {
		// A plain INSERT claims every ID or fails: nothing to read back.
		b.Queue(s.claimNewAll, consumer, sorted)
		return func(br pgx.BatchResults) (map[uuid.UUID]bool, error) {
			tag, err := br.Exec()
			if err != nil {
				return nil, fmt.Errorf("inbox: claim: %w", err)
			}
			if tag.RowsAffected() != int64(len(sorted)) {
				return nil, fmt.Errorf("inbox: claim: %d of %d rows inserted", tag.RowsAffected(), len(sorted))
			}
			claimed := make(map[uuid.UUID]bool, len(sorted))
			for _, id := range sorted {
				claimed[id.Bytes] = true
			}
			return claimed, nil
		}
	}
	b.Queue(many, consumer, sorted)
	return func(br pgx.BatchResults) (map[uuid.UUID]bool, error) {
		rows, err := br.Query()
		return scanClaims(rows, err, len(ids))
	}
}

// sortedArgs returns ids sorted and without repeats, as a uuid[] argument.
func sortedArgs(ids []uuid.UUID) []pgtype.UUID {
	sorted := slices.Clone(ids)
	slices.SortFunc(sorted, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return pgsql.UUIDs(slices.Compact(sorted))
}

func scanClaims(rows pgx.Rows, err error, n int) (map[uuid.UUID]bool, error) {
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	claimed := make(map[uuid.UUID]bool, n)
	var id [16]byte
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error { claimed[uuid.UUID(id)] = true; return nil })
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	return claimed, nil
}

func (s *Store) unclaimAll(ctx context.Context, tx oncekit.Querier, consumer string, ids []uuid.UUID) error {
	if _, err := tx.Exec(ctx, s.unclaim, consumer, uuidArgs(ids)); err != nil {
		return fmt.Errorf("inbox: release claim: %w", err)
	}
	return nil
}

// settledOf returns which of the messages took effect for consumer: the
// ids claimed (in their text form) and the raws dead-lettered and not
// replayed since.
func (s *Store) settledOf(ctx context.Context, q oncekit.Querier, consumer string, ids []uuid.UUID, raws []string) (map[string]bool, error) {
	// Dead letters hold each raw ID as its storable key.
	keys := make([]string, len(raws))
	byKey := make(map[string]string, len(raws))
	for i, raw := range raws {
		keys[i] = deadKey(raw)
		byKey[keys[i]] = raw
	}
	rows, err := q.Query(ctx, s.settled, consumer, uuidArgs(ids), keys)
	if err != nil {
		return nil, fmt.Errorf("inbox: read claims: %w", err)
	}
	done := map[string]bool{}
	var id string
	_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
		if raw, ok := byKey[id]; ok {
			id = raw
		}
		done[id] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: read claims: %w", err)
	}
	return done, nil
}

// DeadLetterFilter selects dead letters. The zero value selects every
// pending (not replayed) one.
type DeadLetterFilter struct {
	// Consumer restricts to one consumer; "" means all.
	Consumer string
	// IncludeReplayed includes rows already replayed.
	IncludeReplayed bool
	// Limit bounds the rows returned; 0 means 100.
	Limit int
}

// ErrDeadLetterNotFound is returned for a dead letter ID that does not exist
// (or, for a replay, was already replayed).
var ErrDeadLetterNotFound = errors.New("inbox: dead letter not found")

// ListDeadLetters returns the dead letters f selects, oldest first.
func (s *Store) ListDeadLetters(ctx context.Context, q oncekit.Querier, f DeadLetterFilter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := q.Query(ctx, s.listDead, f.Consumer, f.IncludeReplayed, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		dl, err := scanDead(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", err)
	}
	return out, nil
}

// GetDeadLetter returns one dead letter, or ErrDeadLetterNotFound.
func (s *Store) GetDeadLetter(ctx context.Context, q oncekit.Querier, id int64) (DeadLetter, error) {
	return scanDead(q.QueryRow(ctx, s.getDead, id))
}

// PruneFilter selects the dead letters Store.PruneDeadLetters deletes (what
// `oncekit dlq prune` asks for).
type PruneFilter struct {
	// Consumer restricts to one consumer; "" means all.
	Consumer string
	// ID deletes one dead letter; 0 means any.
	ID int64
	// Before deletes rows created before it; the zero time means now.
	Before time.Time
	// ReplayedOnly deletes only rows already replayed.
	ReplayedOnly bool
}

// pruneBatch bounds the rows one DELETE of PruneDeadLetters removes.
const pruneBatch = 1000

// PruneDeadLetters deletes the dead letters f selects, 1000 rows per
// statement, and returns how many.
func (s *Store) PruneDeadLetters(ctx context.Context, q oncekit.Querier, f PruneFilter) (int64, error) {
	if f.Before.IsZero() {
		f.Before = time.Now().Add(time.Second)
	}
	var total int64
	for {
		tag, err := q.Exec(ctx, s.pruneDead, f.Consumer, f.ID, f.Before, f.ReplayedOnly, pruneBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: prune dead letters: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}

// pruneReplayed deletes up to limit of consumer's dead letters replayed
// before before and returns how many it deleted.
func (s *Store) pruneReplayed(ctx context.Context, q oncekit.Querier, consumer string, before time.Time, limit int) (int64, error) {
	tag, err := q.Exec(ctx, s.pruneReplayedDead, consumer, before, limit)
	if err != nil {
		return 0, fmt.Errorf("inbox: prune dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}

// PruneClaims runs one retention pass over consumer's claims: it deletes
// every claim processed before before, batch rows per statement (1000 when
// batch is not positive), and returns how many it deleted. Each statement
// starts where the previous one ended, in the table's physical order, so a
// pass reads each page a bounded number of times however many rows it
// deletes. One pass at a time works on a consumer's claims: a pass that
// finds another under way leaves the claims to it and returns. It runs its
// statements as fast as q takes them; Consumer.Prune calls it with the
// Consumer's Retention and RetentionBatch, spaced to RetentionRate.
func (s *Store) PruneClaims(ctx context.Context, q oncekit.Querier, consumer string, before time.Time, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	n, err := retention.PruneInTIDOrder(ctx, q, s.pruneClaimBounds, s.pruneClaim, []any{consumer, before}, batch)
	if err != nil {
		return n, fmt.Errorf("inbox: prune claims: %w", err)
	}
	return n, nil
}

// uuidArgs converts ids to a uuid[] argument that pgx encodes in binary
// directly and in every query execution mode (uuid.UUID goes through
// driver.Valuer and a text round trip; [][16]byte has no array type under
// default_query_exec_mode=exec).
func uuidArgs(ids []uuid.UUID) []pgtype.UUID { return pgsql.UUIDs(ids) }
