package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// ErrRecordNotFound is returned by Edge.Resolve for a key without a record.
var ErrRecordNotFound = errors.New("idempotency: no record of the key")

// ErrNotResolvable is returned by Edge.Resolve for a record an operator
// cannot resolve: neither unknown nor in progress past its lease (its
// owner, or a retry, decides it), though it may be unsettled.
var ErrNotResolvable = errors.New("idempotency: the record is not resolvable: neither unknown nor in progress past its lease")

// Ref names a record: its scope, operation and key, either as the client
// sent it (Key) or as idempotency_keys holds it (StoredKey, as
// Edge.Unsettled lists it).
type Ref struct {
	Tenant, Operation string
	Key, StoredKey    string
}

// stored returns the stored key Ref names.
func (r Ref) stored() (string, error) {
	switch {
	case r.Operation == "":
		return "", errors.New("idempotency: Ref: Operation is required")
	case (r.Key == "") == (r.StoredKey == ""):
		return "", errors.New("idempotency: Ref: give Key or StoredKey, one of them")
	case r.Key != "":
		return StoredKey(r.Key), nil
	}
	return r.StoredKey, nil
}

// Decision is an operator's decision, recorded on the record (resolved_by,
// resolution_note, resolved_at), as on side effects.
type Decision struct {
	// By names who decided. Required.
	By string
	// Note says why. Required.
	Note string
}

// Resolution is how an operator settles a record.
type Resolution struct {
	// State is StateCompleted (the operation happened: Response is stored
	// and replayed to every retry) or StateReleased (it did not: a retry
	// with the same body runs it).
	State State
	// Response is the response stored when completed; StatusCode is
	// required. On an edge with a Sealer, a body is sealed, which needs
	// Ref.Key.
	Response StoredResponse
	// Version is the response's version (ResponseVersions.Current). Defaults to 0.
	Version int
	// TTL is how long the response is replayed; the key's meaning is kept
	// seven times as long (as a Route's defaults). Defaults to 24 hours.
	TTL time.Duration
}

// resolveSQL settles an unknown record, or an in-progress one past its
// lease, as an operator decided; the token goes up, so that a late owner
// cannot store over the decision. Released, it frees its business key.
const resolveSQL = `
WITH bk AS (
	DELETE FROM {schema}.idempotency_business_keys
	WHERE $4 = 'released' AND tenant = $1 AND operation = $2 AND key = $3),
u AS (
	UPDATE {schema}.idempotency_keys SET
		state = $4, status_code = $5, response_headers = $6, response_body = $7, body_sealed = $8,
		response_version = $9, token = token + 1, locked_until = NULL,
		completed_at = CASE WHEN $4 = 'completed' THEN now() END,
		body_expires_at = CASE WHEN $4 = 'completed' THEN now() + $10 * interval '1 microsecond' END,
		expires_at = now() + $11 * interval '1 microsecond',
		resolved_by = $12, resolution_note = $13, resolved_at = now(), problem_code = $14
	WHERE tenant = $1 AND operation = $2 AND key = $3
	  AND (state = 'unknown' OR (state = 'in_progress' AND locked_until < now()))
	RETURNING 1)
SELECT count(*), (SELECT state FROM {schema}.idempotency_keys WHERE tenant = $1 AND operation = $2 AND key = $3)
FROM u`

// Resolve settles a record whose outcome is unknown, or whose claim's
// owner died, as an operator decided (res), recording who and why (d).
// It returns ErrRecordNotFound or ErrNotResolvable (wrapped) when there is
// nothing to decide. q is the pool, or a transaction of the caller's.
func (e *Edge) Resolve(ctx context.Context, q oncekit.Querier, ref Ref, res Resolution, d Decision) error {
	stored, err := ref.stored()
	if err != nil {
		return err
	}
	if d.By == "" || d.Note == "" {
		return errors.New("idempotency: resolve: Decision.By and Decision.Note are required: the decision is recorded")
	}
	ttl := res.TTL
	if ttl <= 0 {
		ttl = 24 * time.Hour
	}
	var status *int
	var headers, body []byte
	sealed := false
	switch res.State {
	case StateCompleted:
		if res.Response.StatusCode < 100 || res.Response.StatusCode > 599 {
			return fmt.Errorf("idempotency: resolve: Response.StatusCode %d is not an HTTP status", res.Response.StatusCode)
		}
		status = &res.Response.StatusCode
		h := res.Response.Header
		if h == nil {
			h = http.Header{}
		}
		if headers, err = json.Marshal(h); err != nil {
			return fmt.Errorf("idempotency: resolve: %w", err)
		}
		body = res.Response.Body
		if body == nil {
			body = []byte{}
		}
		if e.cfg.Sealer != nil {
			if ref.Key == "" {
				return errors.New("idempotency: resolve: the edge seals bodies, bound to the key: give Ref.Key")
			}
			if body, err = e.cfg.Sealer.Seal(body, recordID{tenant: ref.Tenant, operation: ref.Operation, key: ref.Key}.aad()); err != nil {
				return fmt.Errorf("idempotency: resolve: seal: %w", err)
			}
			sealed = true
		}
	case StateReleased:
	default:
		return fmt.Errorf("idempotency: resolve: State must be completed or released, not %q", res.State)
	}
	var code *string
	if c := problemCodeOf(res.Response.StatusCode, res.Response.Header.Get("Content-Type"), res.Response.Body); c != "" && res.State == StateCompleted {
		code = &c
	}
	var n int
	var now *string
	err = q.QueryRow(ctx, e.sql.resolve, ref.Tenant, ref.Operation, stored, string(res.State), status, pgsql.JSON(headers), body,
		sealed, res.Version, micros(ttl), micros(7*ttl), d.By, d.Note, code).Scan(&n, &now)
	switch {
	case err != nil:
		return fmt.Errorf("idempotency: resolve: %w", err)
	case n == 1:
		e.log.Info("idempotency: record resolved by an operator", "operation", ref.Operation,
			"state", res.State, "by", d.By)
		return nil
	case now == nil:
		return fmt.Errorf("%w: operation %q", ErrRecordNotFound, ref.Operation)
	}
	return fmt.Errorf("%w: it is %s", ErrNotResolvable, *now)
}

// UnsettledRecord is a record waiting for an outcome, as Edge.Unsettled
// lists it.
type UnsettledRecord struct {
	Tenant, Operation string
	StoredKey         string
	State             State // StateInProgress or StateUnknown
	// Stale is true for an in-progress record whose lease ran out: its
	// owner died, and no retry has come to recover it.
	Stale     bool
	Reason    string // the unknown's
	CreatedAt time.Time
}

// listUnknownSQL lists unsettled records, the oldest first, from the
// idempotency_keys_unsettled index.
const listUnknownSQL = `
SELECT tenant, operation, key, state, coalesce(locked_until < now(), false), coalesce(unknown_reason, ''), created_at
FROM {schema}.idempotency_keys
WHERE ` + unsettled + ` AND ($1 = '' OR operation = $1)
ORDER BY created_at LIMIT $2`

// Unsettled lists up to limit unsettled records, of operation ("" for
// all), the oldest first. A record is unsettled while it waits for an
// outcome: in progress (running, or its owner died: UnsettledRecord.Stale)
// or unknown; the unsettled_* gauges count the same records. Of those,
// Edge.Resolve takes the unknown and the stale ones.
func (e *Edge) Unsettled(ctx context.Context, q oncekit.Querier, operation string, limit int) ([]UnsettledRecord, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := q.Query(ctx, e.sql.listUnknown, operation, limit)
	if err != nil {
		return nil, fmt.Errorf("idempotency: unsettled: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (UnsettledRecord, error) {
		var u UnsettledRecord
		err := row.Scan(&u.Tenant, &u.Operation, &u.StoredKey, &u.State, &u.Stale, &u.Reason, &u.CreatedAt)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("idempotency: unsettled: %w", err)
	}
	return out, nil
}
