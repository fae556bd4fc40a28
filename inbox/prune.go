package inbox

import (
	"context"
	"time"

	"github.com/oncekit/oncekit"
)

// retain prunes the consumer's claims older than Retention and its dead
// letters replayed more than DeadLetterRetention ago, in bounded batches,
// every RetentionInterval until ctx ends.
func (c *Consumer) retain(ctx context.Context) {
	t := time.NewTicker(c.cfg.RetentionInterval)
	defer t.Stop()
	for {
		if _, err := c.Prune(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("inbox retention failed", "err", err)
		}
		if _, err := c.PruneDeadLetters(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("dead letter retention failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Prune deletes the consumer's claims older than Retention, RetentionBatch
// rows per statement, and returns how many it deleted. Run calls it every
// RetentionInterval.
func (c *Consumer) Prune(ctx context.Context) (int64, error) {
	return c.pruneOlder(ctx, c.cfg.Retention, c.store.PruneClaims)
}

// PruneDeadLetters deletes the consumer's dead letters replayed more than
// DeadLetterRetention ago, RetentionBatch rows per statement, and returns how
// many it deleted. Dead letters not yet replayed are kept. Run calls it every
// RetentionInterval.
func (c *Consumer) PruneDeadLetters(ctx context.Context) (int64, error) {
	return c.pruneOlder(ctx, c.cfg.DeadLetterRetention, c.store.pruneReplayed)
}

// pruneOlder runs prune for the consumer's rows older than retention (none
// when it is negative), RetentionBatch rows a statement, until a statement
// deletes fewer, and returns how many it deleted.
func (c *Consumer) pruneOlder(ctx context.Context, retention time.Duration,
	prune func(ctx context.Context, q oncekit.Querier, consumer string, before time.Time, limit int) (int64, error)) (int64, error) {
	if retention < 0 {
		return 0, nil
	}
	before := time.Now().Add(-retention)
	var total int64
	for {
		n, err := prune(ctx, c.db, c.cfg.Name, before, c.cfg.RetentionBatch)
		total += n
		if err != nil || n < int64(c.cfg.RetentionBatch) {
			return total, err
		}
	}
}
