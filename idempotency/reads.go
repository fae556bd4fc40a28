package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// Records reads the edge's records (idempotency_keys) for operators' tools
// (oncekit status, the console, drift): the idempotency package is the one
// place that says what its rows mean. Unlike an Edge it needs no pool:
// each read takes the querier to run on, so that a caller's figures can
// come from one transaction, and reads through an index or under a limit.
// It is safe for concurrent use.
type Records struct {
	schema string
}

// NewRecords returns the reads of the records in schema ("" means
// oncekit.DefaultSchema).
func NewRecords(schema string) (*Records, error) {
	s, err := pgsql.ValidateSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	return &Records{schema: s}, nil
}

// RecordCounts counts the records by state.
type RecordCounts struct {
	// InProgress counts the records in progress under a lease,
	// InProgressPastLease those whose lease ran out (their owner died).
	InProgress, InProgressPastLease int64
	// Completed counts the completed records up to the cap Count was
	// given, CompletedCapped says it stopped there: a count of every one
	// would read the whole table's index, and grow with it.
	Completed       int64
	CompletedCapped bool
	// Unknown counts the records whose outcome is unknown.
	Unknown int64
}

// countsSQL reads a partial index per count: in-progress claims under a
// lease, completed records (idempotency_keys_expired, the newest first:
// under a bare limit the planner reads the table from its first page,
// which a large table's sequential scan does not keep in shared_buffers),
// unknown ones (idempotency_keys_unsettled).
const countsSQL = `SELECT
	(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'in_progress' AND locked_until IS NOT NULL),
	(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'in_progress' AND locked_until IS NOT NULL AND locked_until < now()),
	(SELECT count(*) FROM (SELECT FROM {schema}.idempotency_keys WHERE state = 'completed' AND expires_at > '-infinity'
		ORDER BY expires_at DESC LIMIT $1) c),
	(SELECT count(*) FROM {schema}.idempotency_keys WHERE state = 'unknown')`

// Count counts the records by state, the completed ones up to
// completedCap.
func (r *Records) Count(ctx context.Context, q oncekit.Querier, completedCap int) (RecordCounts, error) {
	var c RecordCounts
	err := q.QueryRow(ctx, pgsql.Render(countsSQL, r.schema), completedCap+1).
		Scan(&c.InProgress, &c.InProgressPastLease, &c.Completed, &c.Unknown)
	if err != nil {
		return RecordCounts{}, fmt.Errorf("idempotency: count records: %w", err)
	}
	if c.Completed > int64(completedCap) {
		c.Completed, c.CompletedCapped = int64(completedCap), true
	}
	return c, nil
}

// Record is one record, as Records.Get reads it.
type Record struct {
	State      State
	StatusCode int // 0 until completed
	// Headers is the stored response's headers as JSON, "" when none;
	// Body its body, nil when none, sealed (encrypted) when Sealed.
	Headers     string
	Body        []byte
	Sealed      bool
	CreatedAt   time.Time
	CompletedAt *time.Time
	ExpiresAt   time.Time
	// Token is the fencing token, bumped on every recovery; Recoveries
	// counts them.
	Token      int64
	Recoveries int
	// UnknownReason says why the outcome is unknown; ResolvedBy and
	// ResolutionNote record an operator's decision.
	UnknownReason, ResolvedBy, ResolutionNote string
	// ProblemCode is the answer's problem code (Status.Code), "" for none;
	// OperationID the operation's ID (Info.ID), uuid.Nil for a record
	// claimed before it was kept.
	ProblemCode string
	OperationID uuid.UUID
}

const recordSQL = `
SELECT k.state, coalesce(k.status_code, 0), coalesce(k.response_headers::text, ''), k.response_body, k.body_sealed,
	k.created_at, k.completed_at, k.expires_at, k.token, k.recoveries,
	coalesce(k.unknown_reason, ''), coalesce(k.resolved_by, ''), coalesce(k.resolution_note, ''),
	coalesce(k.problem_code, ''), coalesce(k.operation_id, '00000000-0000-0000-0000-000000000000')
FROM {schema}.idempotency_keys k WHERE k.tenant = $1 AND k.operation = $2 AND k.key = $3`

// Get reads the record ref names, by its primary key, or returns
// ErrRecordNotFound.
func (r *Records) Get(ctx context.Context, q oncekit.Querier, ref Ref) (Record, error) {
	key, err := ref.stored()
	if err != nil {
		return Record{}, err
	}
	var rec Record
	err = q.QueryRow(ctx, pgsql.Render(recordSQL, r.schema), ref.Tenant, ref.Operation, key).Scan(&rec.State, &rec.StatusCode,
		&rec.Headers, &rec.Body, &rec.Sealed, &rec.CreatedAt, &rec.CompletedAt, &rec.ExpiresAt, &rec.Token, &rec.Recoveries,
		&rec.UnknownReason, &rec.ResolvedBy, &rec.ResolutionNote, &rec.ProblemCode, &rec.OperationID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: operation %q", ErrRecordNotFound, ref.Operation)
	}
	if err != nil {
		return Record{}, fmt.Errorf("idempotency: get record: %w", err)
	}
	return rec, nil
}

// ByOperationID returns the records whose operation's ID (Info.ID, the
// ID of the row the request created: a payment's) is id, up to limit,
// through the index idempotency_keys_operation_id: one, unless the same
// scope and key were used on several operations.
func (r *Records) ByOperationID(ctx context.Context, q oncekit.Querier, id uuid.UUID, limit int) ([]Ref, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT tenant, operation, key FROM {schema}.idempotency_keys
		WHERE operation_id = $1 ORDER BY tenant, operation, key LIMIT $2`, r.schema), id, limit)
	if err != nil {
		return nil, fmt.Errorf("idempotency: records by operation ID: %w", err)
	}
	refs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Ref, error) {
		var ref Ref
		err := row.Scan(&ref.Tenant, &ref.Operation, &ref.StoredKey)
		return ref, err
	})
	if err != nil {
		return nil, fmt.Errorf("idempotency: records by operation ID: %w", err)
	}
	return refs, nil
}

// HeldRecord is a record that holds its key without an outcome, as
// PastLease and Unknown list it.
type HeldRecord struct {
	Tenant, Operation, StoredKey string
	// LockedUntil is the end of an in-progress record's lease.
	LockedUntil *time.Time
	// UnknownReason says why an unknown record's outcome is unknown.
	UnknownReason string
}

// PastLease lists up to limit records in progress whose lease ran out more
// than grace ago (their owner died, and no retry came to recover them), by
// tenant, operation and key, and counts them all.
func (r *Records) PastLease(ctx context.Context, q oncekit.Querier, grace time.Duration, limit int) ([]HeldRecord, int64, error) {
	return r.held(ctx, q, "past lease", `k.state = 'in_progress' AND k.locked_until IS NOT NULL
		AND k.locked_until < now() - make_interval(secs => $2)`, limit, grace.Seconds())
}

// Unknown lists up to limit records whose outcome is unknown (they wait
// for a reconciliation or an operator: Edge.Resolve), by tenant, operation
// and key, and counts them all; the partial index
// idempotency_keys_unsettled.
func (r *Records) Unknown(ctx context.Context, q oncekit.Querier, limit int) ([]HeldRecord, int64, error) {
	return r.held(ctx, q, "unknown", `k.state = 'unknown'`, limit)
}

func (r *Records) held(ctx context.Context, q oncekit.Querier, what, where string, limit int, args ...any) ([]HeldRecord, int64, error) {
	rows, err := q.Query(ctx, pgsql.Render(`SELECT k.tenant, k.operation, k.key, k.locked_until, coalesce(k.unknown_reason, ''),
		count(*) OVER () FROM {schema}.idempotency_keys k WHERE `+where+`
		ORDER BY k.tenant, k.operation, k.key LIMIT $1`, r.schema), append([]any{limit}, args...)...)
	if err != nil {
		return nil, 0, fmt.Errorf("idempotency: %s: %w", what, err)
	}
	var total int64
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (HeldRecord, error) {
		var h HeldRecord
		err := row.Scan(&h.Tenant, &h.Operation, &h.StoredKey, &h.LockedUntil, &h.UnknownReason, &total)
		return h, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("idempotency: %s: %w", what, err)
	}
	return out, total, nil
}
