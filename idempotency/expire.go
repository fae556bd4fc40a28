package idempotency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// Expired is a record Prune is about to let go of, as Config.OnExpire
// receives it: its response body reached Route.TTL (Deleted false: the
// body is emptied, the key's meaning kept), or the whole record reached
// Route.KeyTTL (Deleted true: the row is deleted).
type Expired struct {
	// Deleted is true when the record itself goes, false when only its
	// response body does.
	Deleted bool
	// Tenant and Operation are the record's scope and operation.
	Tenant, Operation string
	// KeyDigest is the key as the table holds it (StoredKey): never the
	// key as the client sent it.
	KeyDigest string
	// State is completed or released.
	State State
	// StatusCode is the stored response's status (0: none).
	StatusCode int
	// Body is the response body as stored (sealed when BodySealed), nil
	// when there is none (released, Responses.NoStoreBody, or emptied at
	// TTL before the record's deletion).
	Body []byte
	// BodySealed says whether Body is sealed by Config.Sealer.
	BodySealed bool
	// CreatedAt is when the record was claimed; ExpiredAt, the expiry it
	// reached (its body's or its own).
	CreatedAt, ExpiredAt time.Time
}

// expiringRecordsSQL lists up to $1 completed or released records past
// their expiry ($2: true for the record's, false for its body's), after
// the cursor ($3 expiry, $4 tenant, $5 operation, $6 key).
const expiringRecordsSQL = `
SELECT tenant, operation, key, state, coalesce(status_code, 0), response_body, body_sealed, created_at,
	CASE WHEN $2 THEN expires_at ELSE body_expires_at END AS expiry
FROM {schema}.idempotency_keys
WHERE state IN ('completed', 'released')
  AND CASE WHEN $2 THEN expires_at <= now() ELSE response_body IS NOT NULL AND body_expires_at <= now() END
  AND (CASE WHEN $2 THEN expires_at ELSE body_expires_at END, tenant, operation, key) > ($3, $4, $5, $6)
ORDER BY expiry, tenant, operation, key
LIMIT $1`

// expireRecordSQL deletes a record whose expiry the hook took, unless a
// new request claimed its key meanwhile.
const expireRecordSQL = `
DELETE FROM {schema}.idempotency_keys
WHERE tenant = $1 AND operation = $2 AND key = $3 AND state IN ('completed', 'released') AND expires_at <= now()`

// expireBodySQL empties a response body whose expiry the hook took.
const expireBodySQL = `
UPDATE {schema}.idempotency_keys SET response_body = NULL
WHERE tenant = $1 AND operation = $2 AND key = $3 AND state IN ('completed', 'released')
  AND response_body IS NOT NULL AND body_expires_at <= now()`

// errHookPanicked is what a panicking OnExpire counts as.
var errHookPanicked = errors.New("idempotency: Config.OnExpire panicked")

// expireThroughHook gives every completed or released record past its
// expiry (first the records past KeyTTL, then the bodies past TTL) to
// Config.OnExpire, once each in the pass, and deletes the record (or
// empties the body) only when the hook returns nil: a record the hook
// failed is kept for the next pass. A batch the hook fails entirely (an
// archive that is down) ends the pass. It returns the records deleted and
// an error naming how many the hook failed. Without OnExpire it does
// nothing (Prune deletes in bulk).
func (e *Edge) expireThroughHook(ctx context.Context) (deleted int64, err error) {
	if e.cfg.OnExpire == nil {
		return 0, nil
	}
	var failed int64
	var firstErr error
	for _, whole := range []bool{true, false} {
		n, f, ferr, err := e.expirePhase(ctx, whole)
		if whole {
			deleted = n
		}
		failed += f
		firstErr = cmp.Or(firstErr, ferr)
		if err != nil {
			return deleted, err
		}
	}
	if failed > 0 {
		return deleted, fmt.Errorf("idempotency: prune: Config.OnExpire failed for %d records, kept for the next pass: %w", failed, firstErr)
	}
	return deleted, nil
}

// expirePhase is one phase of expireThroughHook: records past KeyTTL
// (whole) or bodies past TTL. It returns how many it let go, how many
// the hook failed and the first failure, and a store error.
func (e *Edge) expirePhase(ctx context.Context, whole bool) (done, failed int64, hookErr, err error) {
	list := pgsql.Render(expiringRecordsSQL, e.cfg.Schema)
	apply := pgsql.Render(expireBodySQL, e.cfg.Schema)
	if whole {
		apply = pgsql.Render(expireRecordSQL, e.cfg.Schema)
	}
	var at time.Time
	var tenant, operation, key string
	for {
		rows, err := e.db.Query(ctx, list, e.cfg.RetentionBatch, whole, at, tenant, operation, key)
		if err != nil {
			return done, failed, hookErr, fmt.Errorf("idempotency: prune: list expired records: %w", err)
		}
		batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Expired, error) {
			x := Expired{Deleted: whole}
			err := row.Scan(&x.Tenant, &x.Operation, &x.KeyDigest, &x.State, &x.StatusCode, &x.Body, &x.BodySealed, &x.CreatedAt, &x.ExpiredAt)
			return x, err
		})
		if err != nil {
			return done, failed, hookErr, fmt.Errorf("idempotency: prune: list expired records: %w", err)
		}
		batchFailed := 0
		for _, x := range batch {
			at, tenant, operation, key = x.ExpiredAt, x.Tenant, x.Operation, x.KeyDigest
			if herr := e.callOnExpire(ctx, x); herr != nil {
				failed++
				batchFailed++
				hookErr = cmp.Or(hookErr, herr)
				e.log.Warn("idempotency: OnExpire failed; the record is kept for the next pass",
					"operation", x.Operation, "key_digest", x.KeyDigest[:min(len(x.KeyDigest), 16)], "deleted", whole, "error", herr)
				continue
			}
			tag, err := e.db.Exec(ctx, apply, x.Tenant, x.Operation, x.KeyDigest)
			if err != nil {
				return done, failed, hookErr, fmt.Errorf("idempotency: prune: let an expired record go: %w", err)
			}
			done += tag.RowsAffected()
		}
		if whole {
			e.m.cleanedTotal.Add(float64(len(batch) - batchFailed))
		}
		if len(batch) < e.cfg.RetentionBatch || (len(batch) > 0 && batchFailed == len(batch)) {
			return done, failed, hookErr, nil
		}
	}
}

// callOnExpire calls Config.OnExpire, a panic counting as a failure.
func (e *Edge) callOnExpire(ctx context.Context, x Expired) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", errHookPanicked, p)
		}
	}()
	return e.cfg.OnExpire(ctx, x)
}
