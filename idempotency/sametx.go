package idempotency

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/wait"
)

// serveSameTx claims the key inside a transaction, runs the handler in it and
// stores the response with the commit. Round trips to PostgreSQL beyond the
// handler's own BEGIN … COMMIT: none. The claim rides in the BEGIN's round
// trip, the stored response in the COMMIT's.
func (rt *route) serveSameTx(next http.Handler, w http.ResponseWriter, r *http.Request, id recordID, fp []byte) {
	ctx := r.Context()
	lockTimeout := rt.lockTimeout
	deadline, waiting := time.Now().Add(rt.cfg.waitFor()), false
	defer func() {
		if waiting {
			rt.stopWaiting(id)
		}
	}()
	for attempt := 0; attempt < maxClaimAttempts; attempt++ {
		conn, tx, rec, claimed, token, err := rt.claimTx(ctx, id, fp, lockTimeout)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && gaveUpOnLock(ctx, pgErr) {
				if !waitedOnRow(pgErr) && lockTimeout != rt.patientLockTimeout {
					// Another lock than the key's outlasted the wait (the
					// table's extension under load, a migration's table
					// lock): that says nothing about the key. Claim again,
					// waiting longer.
					lockTimeout = rt.patientLockTimeout
					continue
				}
				// The row's lock is held. A claim's INSERT … ON CONFLICT
				// DO UPDATE locks the row it conflicts with until its
				// transaction ends, taken or not: a concurrent replay of a
				// completed record holds it too. Such a record is
				// replayed, not answered as in progress.
				if rec, ok := rt.completedRecord(ctx, id, pgErr); ok {
					if rec, found, err := rt.e.replicated(ctx, id, rec); err != nil {
						rt.storeFailed(w, id, err)
						return
					} else if found {
						rt.answerExisting(w, id, fp, rec, false)
						return
					}
				}
				// In progress. A request that waits does so without a
				// connection, in one of the key's Waiting.MaxWaiters places.
				if rt.cfg.waitFor() > 0 && time.Now().Before(deadline) && (waiting || rt.startWaiting(id)) {
					waiting = true
					if wait.Sleep(ctx, min(rt.pollInterval(), time.Until(deadline))) {
						lockTimeout, attempt = rt.lockTimeout, -1
						continue
					}
				}
				rt.e.m.conflictAge.WithLabelValues(id.operation).Observe(rt.cfg.waitFor().Seconds())
				rt.inProgress(w)
				return
			}
			if !errors.As(err, &pgErr) || pgErr.Code != "40001" { // serialization failure: look again
				rt.storeFailed(w, id, err)
				return
			}
		}
		if claimed {
			rt.e.watch.OK("store")
			if rt.overKeyLimit(w, id, token) {
				_ = tx.Rollback(context.WithoutCancel(ctx)) // nothing stored
				conn.Release()
				return
			}
			if id.business != "" {
				if held, err := rt.claimBusinessKeyTx(ctx, tx, id, fp); held || err != nil {
					_ = tx.Rollback(context.WithoutCancel(ctx)) // nothing stored
					conn.Release()
					rt.answerBusinessKeyTx(w, r, id, fp, err)
					return
				}
			}
			rt.runSameTx(next, w, r, id, fp, conn, tx, token)
			return
		}
		if rec == nil {
			// The holder committed while the claim waited for it (or the
			// isolation level hid it): read the record afresh.
			got, found, err := rt.e.lookup(ctx, id)
			if err != nil {
				rt.storeFailed(w, id, err)
				return
			}
			if !found {
				continue // rolled back meanwhile: claim again
			}
			rec = &got
		}
		if rec.state == StateReleased && subtle.ConstantTimeCompare(rec.fingerprint, fp) == 1 {
			continue // released meanwhile, with this body: claim again
		}
		rec, found, err := rt.e.replicated(ctx, id, rec)
		if err != nil {
			rt.storeFailed(w, id, err)
			return
		}
		if !found {
			continue
		}
		rt.answerExisting(w, id, fp, rec, false)
		return
	}
	rt.inProgress(w)
}

// completedRecord returns the key's committed record when a claim that
// gave up on its row's lock (err) finds it completed with its response
// still kept: the lock's holder is then another request reading it, not
// one running it. Any other record (in progress, released or expired,
// which the holder may be taking over) or a failed lookup reports false,
// and the request is answered as in progress.
func (rt *route) completedRecord(ctx context.Context, id recordID, err *pgconn.PgError) (*record, bool) {
	if !waitedOnRow(err) {
		return nil, false
	}
	rec, found, lerr := rt.e.lookup(ctx, id)
	if lerr != nil || !found || rec.state != StateCompleted || rec.bodyExpired {
		return nil, false
	}
	return &rec, true
}

// gaveUpOnLock reports whether a claim's statement stopped waiting for a
// lock: its lock_timeout (55P03), or a cancel that the request did not ask
// for (57014 while ctx lives). oncekit sends no cancels, and pgx abandons a
// cancelled context's connection rather than cancel its statement; a cancel
// comes from an operator's pg_cancel_backend, or from PostgreSQL itself,
// which reports a lock timeout that fired as the lock was granted as a
// cancel "due to user request" once the statement waits for a second lock.
// Either way the claim did not run: it is taken for a lock wait that ended.
func gaveUpOnLock(ctx context.Context, err *pgconn.PgError) bool {
	return err.Code == "55P03" || err.Code == "57014" && ctx.Err() == nil
}

// waitedOnRow reports whether a lock timeout was spent waiting for another
// transaction's row: the key's claim held by a request still running.
// PostgreSQL names the row in the error's context ("while inserting index
// tuple (0,1) in relation …", "while locking tuple …"); a wait for any other
// lock has no such line. On a server whose messages are translated
// (lc_messages) no timeout matches, and each is taken as another lock's:
// the request claims once more, waiting longer, and then answers 409.
func waitedOnRow(err *pgconn.PgError) bool {
	return strings.Contains(err.Where, " tuple ")
}

// claimTx begins a transaction and, in the same pipelined round trip, claims
// the key or reads the committed record holding it, waiting for locks at most
// as long as lockTimeout (a SET LOCAL statement) says. When claimed, conn and
// tx are returned open; otherwise they are already rolled back and released.
func (rt *route) claimTx(ctx context.Context, id recordID, fp []byte, lockTimeout string) (conn *pgxpool.Conn, tx pgx.Tx, rec *record, claimed bool, token int64, err error) {
	conn, err = rt.e.db.Acquire(ctx)
	if err != nil {
		return nil, nil, nil, false, 0, fmt.Errorf("acquire: %w", err)
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(lockTimeout)
	b.Queue(rt.e.sql.claimTx, id.tenant, id.operation, id.stored(), fp, micros(rt.cfg.KeyTTL), rt.cfg.Responses.RunExpiredRetries, id.operationID()).QueryRow(func(row pgx.Row) error {
		var status *int32
		var headers []byte
		var age float64
		var state *string
		var got record
		dest := got.dest(&status, &headers, &age)
		dest[1] = &state // NULL in a claim's row
		err := row.Scan(append([]any{&claimed, &token}, dest...)...)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if !claimed {
			got.state = State(*state)
			if err := got.fill(status, headers, age); err != nil {
				return err
			}
			rec = &got
		}
		return nil
	})
	b.Queue("SET LOCAL lock_timeout TO DEFAULT")
	br := conn.SendBatch(ctx, b)
	tx = br.Tx()
	err = br.Close()
	if err == nil && claimed {
		return conn, tx, nil, true, token, nil
	}
	// A transaction that never began is closed already: Rollback is a no-op.
	_ = tx.Rollback(context.WithoutCancel(ctx))
	conn.Release()
	if err != nil {
		return nil, nil, nil, false, 0, fmt.Errorf("claim: %w", err)
	}
	return nil, nil, rec, false, 0, nil
}

// runSameTx runs the handler in the claim's transaction and commits the
// stored response with the handler's writes, or rolls everything back when
// the response is not to be stored.
func (rt *route) runSameTx(next http.Handler, w http.ResponseWriter, r *http.Request, id recordID, fp []byte, conn *pgxpool.Conn, tx pgx.Tx, token int64) {
	bg := context.WithoutCancel(r.Context())
	rt.countNew(id)
	info := Info{Tenant: id.tenant, Operation: id.operation, Key: id.key, Token: token}
	ctx, out := withOutcome(context.WithValue(withInfo(r.Context(), info), txKey{}, pgx.Tx(ownedTx{tx})))
	rw, panicked := runHandler(next, r.WithContext(ctx))

	if out.unknown && panicked == nil {
		rt.commitUnknown(bg, w, id, conn, tx, token, out.reason)
		return
	}
	if panicked != nil || rt.releases(rw) {
		_ = tx.Rollback(bg)
		// The claim went with the rollback: the key keeps the body it was
		// used with, so that another is refused.
		if _, err := conn.Exec(bg, rt.e.sql.released, id.tenant, id.operation, id.stored(), fp, micros(rt.cfg.TTL),
			storableCode(rw, panicked), id.operationID()); err != nil {
			rt.e.log.Warn("idempotency: recording the released key failed; another body under it would run",
				"operation", id.operation, "key_hash", keyHash(id), "error", err)
		}
		conn.Release()
		rt.answerReleased(w, id, rw, panicked)
		return
	}

	crashpoint.Hit("idempotency.before-commit")
	err := rt.commitTx(bg, id, tx, token, rw)
	if conn.Conn().PgConn().TxStatus() != 'I' {
		_ = tx.Rollback(bg)
	}
	conn.Release()
	if err != nil {
		// Commit failed or its outcome is unknown: the client retries with the
		// same key and gets either the stored response or a fresh execution.
		rt.storeFailed(w, id, err)
		return
	}
	rt.e.m.stored.WithLabelValues(id.operation).Inc()
	rw.sendTo(w)
}

// commitTx stores the response and commits, pipelined in one round trip.
func (rt *route) commitTx(ctx context.Context, id recordID, tx pgx.Tx, token int64, rw *recorder) error {
	headers, body, sealed, err := rt.encode(id, rw)
	if err != nil {
		return err
	}
	b := &pgx.Batch{}
	var stored, committed bool
	b.Queue(rt.e.sql.completeTx, id.tenant, id.operation, id.stored(), token, rw.code(), pgsql.JSON(headers), body, sealed,
		micros(rt.cfg.KeyTTL), micros(rt.cfg.TTL), rt.cfg.responseVersion(), rt.businessLocation(rw), storableCode(rw, nil)).Exec(func(pgconn.CommandTag) error {
		stored = true
		return nil
	})
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		committed = tag.String() == "COMMIT"
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("store and commit: %w", err)
	}
	if !stored || !committed {
		return fmt.Errorf("store and commit: stored=%v committed=%v", stored, committed)
	}
	return nil
}

// commitUnknown commits the handler's writes with the record unknown
// (reason), and answers so.
func (rt *route) commitUnknown(ctx context.Context, w http.ResponseWriter, id recordID, conn *pgxpool.Conn, tx pgx.Tx, token int64, reason string) {
	rt.e.m.unknown.WithLabelValues(id.operation).Inc()
	rt.e.log.Warn("idempotency: the request's outcome is unknown", "operation", id.operation,
		"key_hash", keyHash(id), "token", token, "reason", reason)
	b := &pgx.Batch{}
	b.Queue(rt.e.sql.unknownTx, id.tenant, id.operation, id.stored(), token, reason, micros(rt.cfg.KeyTTL))
	b.Queue("COMMIT")
	err := tx.SendBatch(ctx, b).Close()
	if conn.Conn().PgConn().TxStatus() != 'I' {
		_ = tx.Rollback(ctx)
	}
	conn.Release()
	if err != nil {
		// Nothing committed, or the commit's outcome is lost: the retry
		// finds the record unknown, or runs the request again.
		rt.storeFailed(w, id, fmt.Errorf("record the unknown outcome: %w", err))
		return
	}
	rt.answerUnknown(w, id)
}
