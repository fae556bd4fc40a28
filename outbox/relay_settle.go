package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/internal/backoff"
	"github.com/oncekit/oncekit/internal/untrusted"
)

// maxErrBytes caps the broker error text outbox.last_error keeps.
const maxErrBytes = 2000

// settle records a batch in one fenced statement. Its cursor moves past
// every main row read; rows it passes without an acknowledgement are held:
// a failed row counts an attempt and backs off (parked after MaxAttempts),
// a row not attempted follows its blocked key. Held rows that were
// acknowledged are released. On the happy path (every row read after the
// cursor, every one acknowledged) moving the cursor is the only write. It
// returns the number of failed rows.
func (r *Relay) settle(ctx context.Context, w *worker, b *batch) (nfailed int, err error) {
	var cursor int64
	var released, seqs, follow []int64
	var errs []string
	var delays []float64
	var firstErr error
	for i := range b.rows {
		row := &b.rows[i]
		if !row.retry {
			cursor = row.seq
		}
		switch b.outcome[i] {
		case acked:
			if row.held {
				released = append(released, row.seq)
			}
		case failed:
			if firstErr == nil {
				firstErr = b.errs[i]
			}
			seqs = append(seqs, row.seq)
			errs = append(errs, untrusted.Text(b.errs[i].Error(), maxErrBytes)) // a broker's text is untrusted
			delays = append(delays, r.retryDelay(row.attempts).Seconds())
		case notSent:
			if !row.retry {
				follow = append(follow, row.seq)
			}
		}
	}
	if cursor == 0 && len(released) == 0 && len(seqs) == 0 && len(follow) == 0 {
		return 0, nil
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var moved, nreleased, nfailedRows, nparked, nfollow int64
	if len(released) == 0 && len(seqs) == 0 && len(follow) == 0 {
		err = r.pool.QueryRow(mctx, r.sql.advance, w.part, r.cfg.ID, w.token, cursor).Scan(&moved)
	} else {
		err = r.pool.QueryRow(mctx, r.sql.settle, w.part, r.cfg.ID, w.token, cursor, released,
			seqs, errs, delays, r.cfg.MaxAttempts, follow).Scan(&moved, &nreleased, &nfailedRows, &nparked, &nfollow)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: settle batch: %w", err)
	}
	if moved == 0 {
		r.log.Warn("lease lost before settling the batch; the new owner republishes it (deduplicated)",
			"partition", w.part, "rows", len(b.rows))
		return 0, errLeaseLost
	}
	if len(seqs) > 0 {
		r.m.failures.WithLabelValues("message").Add(float64(len(seqs)))
		r.log.Warn("publish failed; key blocked until retry", "partition", w.part, "failed", len(seqs),
			"parked", nparked, "err", firstErr)
	}
	if nreleased+nfollow > 0 {
		r.log.Debug("held rows settled", "partition", w.part, "released", nreleased, "followers", nfollow)
	}
	return len(seqs), nil
}

// retryDelay is the wait before attempt n+1 of a failed message: exponential
// from MinBackoff, capped at MaxBackoff, with ±20% jitter (within them).
func (r *Relay) retryDelay(n int) time.Duration {
	return backoff.Policy{Min: r.cfg.MinBackoff, Max: r.cfg.MaxBackoff, Jitter: 0.2}.Delay(n + 1)
}
