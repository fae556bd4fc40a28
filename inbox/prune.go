package inbox

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/internal/retention"
	"github.com/oncekit/oncekit/internal/wait"
)

// retain prunes the consumer's claims older than Retention and its dead
// letters replayed more than DeadLetterRetention ago, in bounded batches,
// every RetentionInterval until ctx ends.
func (c *Consumer) retain(ctx context.Context) {
	wait.Every(ctx, c.cfg.RetentionInterval, func(ctx context.Context) {
		if _, err := c.Prune(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("inbox retention failed", "err", err)
		}
		if _, err := c.PruneDeadLetters(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("dead letter retention failed", "err", err)
		}
	})
}

// Prune runs one retention pass: it deletes the consumer's claims older
// than Retention, RetentionBatch rows per statement and at most
// RetentionRate rows per second, and returns how many it
// deleted (Store.PruneClaims). It deletes nothing when Retention is negative.
// Run calls it every RetentionInterval.
func (c *Consumer) Prune(ctx context.Context) (int64, error) {
	if c.cfg.Retention < 0 {
		return 0, nil
	}
	q := retention.Spaced(c.db, retention.Spacing(c.cfg.RetentionRate, c.cfg.RetentionBatch))
	return c.store.PruneClaims(ctx, q, c.cfg.Name, time.Now().Add(-c.cfg.Retention), c.cfg.RetentionBatch)
}

// PruneDeadLetters deletes the consumer's dead letters replayed more than
// DeadLetterRetention ago, RetentionBatch rows per statement, and returns how
// many it deleted. Dead letters not yet replayed are kept. Run calls it every
// RetentionInterval.
func (c *Consumer) PruneDeadLetters(ctx context.Context) (int64, error) {
	if c.cfg.DeadLetterRetention < 0 {
		return 0, nil
	}
	before := time.Now().Add(-c.cfg.DeadLetterRetention)
	var total int64
	for {
		n, err := c.store.pruneReplayed(ctx, c.db, c.cfg.Name, before, c.cfg.RetentionBatch)
		total += n
		if err != nil || n < int64(c.cfg.RetentionBatch) {
			return total, err
		}
	}
}
