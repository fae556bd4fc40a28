package idempotency

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// claimBusinessKeySQL takes the business key $3 for the key $4 (its stored
// digest): a fresh one, one this key holds already (a recovery), or one
// past its lifetime. No row: another key holds it.
const claimBusinessKeySQL = `
INSERT INTO {schema}.idempotency_business_keys AS b (tenant, operation, business_key, key, fingerprint, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + $6 * interval '1 microsecond')
ON CONFLICT (tenant, operation, business_key) DO UPDATE SET
	key = EXCLUDED.key, fingerprint = EXCLUDED.fingerprint, location = NULL,
	created_at = now(), expires_at = EXCLUDED.expires_at
WHERE b.key = EXCLUDED.key OR b.expires_at <= now()
RETURNING true`

// businessKeyHolderSQL reads who holds a business key.
const businessKeyHolderSQL = `
SELECT key, fingerprint, coalesce(location, '')
FROM {schema}.idempotency_business_keys
WHERE tenant = $1 AND operation = $2 AND business_key = $3`

// pruneBusinessKeysSQL deletes up to $1 business keys past their lifetime.
const pruneBusinessKeysSQL = `
WITH gone AS (
	DELETE FROM {schema}.idempotency_business_keys
	WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM {schema}.idempotency_business_keys
		WHERE expires_at <= now()
		ORDER BY expires_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	RETURNING 1)
SELECT count(*) FROM gone`

// storedBusinessKey is a business key as the table holds it: a digest, per
// scope and operation like the key itself.
func storedBusinessKey(bk string) string {
	h := sha256.New()
	h.Write([]byte("oncekit/idempotency/business-key/v1:"))
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(bk))))
	h.Write([]byte(bk))
	return hex.EncodeToString(h.Sum(nil))
}

// businessKeyOf returns the stored form of r's business key ("" for none),
// or answers 400 and reports false.
func (rt *route) businessKeyOf(w http.ResponseWriter, r *http.Request, body []byte) (string, bool) {
	if rt.cfg.BusinessKey == nil {
		return "", true
	}
	bk, err := rt.cfg.BusinessKey.Of(r, body)
	if err != nil {
		rt.count(OutcomeRejected)
		writeProblem(w, http.StatusBadRequest, CodeBodyInvalid, err.Error(), 0)
		return "", false
	}
	if bk == "" {
		return "", true
	}
	return storedBusinessKey(bk), true
}

// businessLocation is the Location a route with business keys records on
// the key's business key when the response is stored.
func (rt *route) businessLocation(rw *recorder) string {
	if rt.cfg.BusinessKey == nil {
		return ""
	}
	return rw.headers().Get("Location")
}

// claimBusinessKeyApart takes the request's business key for its claim
// (Separate mode, committed at once). It reports false when the request is
// not to run, having answered it: another key holds the business key, or
// the store failed.
func (rt *route) claimBusinessKeyApart(w http.ResponseWriter, r *http.Request, id recordID, fp []byte) bool {
	if id.business == "" {
		return true
	}
	var ok bool
	err := rt.e.db.QueryRow(r.Context(), rt.e.sql.claimBusinessKey, id.tenant, id.operation, id.business,
		id.stored(), fp, micros(rt.cfg.BusinessKey.TTL)).Scan(&ok)
	switch {
	case err == nil:
		return true
	case errors.Is(err, pgx.ErrNoRows):
		rt.answerBusinessKeyHeld(w, r, id, fp)
	default:
		rt.storeFailed(w, id, fmt.Errorf("claim the business key: %w", err))
	}
	return false
}

// claimBusinessKeyTx takes the request's business key in the claim's
// transaction (SameTx mode), waiting for no other transaction: one that
// holds the business key uncommitted is a request in progress (a lock
// timeout, 55P03). held reports that another key holds it.
func (rt *route) claimBusinessKeyTx(ctx context.Context, tx pgx.Tx, id recordID, fp []byte) (held bool, err error) {
	claimed := false
	b := &pgx.Batch{}
	b.Queue(rt.lockTimeout)
	b.Queue(rt.e.sql.claimBusinessKey, id.tenant, id.operation, id.business, id.stored(), fp,
		micros(rt.cfg.BusinessKey.TTL)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue("SET LOCAL lock_timeout TO DEFAULT")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return false, err
	}
	return !claimed, nil
}

// answerBusinessKeyTx answers a SameTx request whose business key claim
// (claimBusinessKeyTx) did not take it, once its transaction is gone.
func (rt *route) answerBusinessKeyTx(w http.ResponseWriter, r *http.Request, id recordID, fp []byte, err error) {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		rt.answerBusinessKeyHeld(w, r, id, fp)
	case errors.As(err, &pgErr) && gaveUpOnLock(r.Context(), pgErr):
		rt.inProgress(w)
	default:
		rt.storeFailed(w, id, fmt.Errorf("claim the business key: %w", err))
	}
}

// answerBusinessKeyHeld answers a request whose business key another
// Idempotency-Key holds: that operation's stored response when the two
// requests are the same and the route replays, 409 in progress while it
// runs, else 409 BUSINESS_KEY_REUSED linking its resource.
func (rt *route) answerBusinessKeyHeld(w http.ResponseWriter, r *http.Request, id recordID, fp []byte) {
	ctx := r.Context()
	var holder, location string
	var holderFP []byte
	err := rt.e.db.QueryRow(ctx, rt.e.sql.businessKeyHolder, id.tenant, id.operation, id.business).Scan(&holder, &holderFP, &location)
	if errors.Is(err, pgx.ErrNoRows) {
		rt.inProgress(w) // freed meanwhile (its request was released): the retry claims it
		return
	}
	if err != nil {
		rt.storeFailed(w, id, fmt.Errorf("read the business key: %w", err))
		return
	}
	rec, found, err := rt.e.lookupStored(ctx, id.tenant, id.operation, holder)
	if err != nil {
		rt.storeFailed(w, id, err)
		return
	}
	if found && location == "" {
		location = rec.headers.Get("Location")
	}
	same := subtle.ConstantTimeCompare(holderFP, fp) == 1
	switch {
	case found && rec.state == StateInProgress && same:
		rt.inProgress(w)
		return
	case found && same && !rt.cfg.BusinessKey.Conflict && rec.state == StateCompleted && !rec.bodyExpired && !rec.sealed:
		// A sealed body is bound to its own key, which only its digest
		// here knows: it is answered as reused instead.
		rt.replayStored(w, &rec, rec.body, OutcomeBusinessKey)
		return
	}
	rt.count(OutcomeBusinessKey)
	if location != "" {
		w.Header().Set("Link", "<"+location+`>; rel="related"`)
	}
	writeProblemAt(w, http.StatusConflict, CodeBusinessKeyReused,
		"this operation was already requested under another Idempotency-Key; it is not run again", location, 0)
}
