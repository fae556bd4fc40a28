package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
)

// ReplayStats count what ReplayWindow did with the window's messages.
type ReplayStats struct {
	Seen         int64 // messages the window delivered
	Applied      int64 // no claim: the handler ran and committed
	Absorbed     int64 // the claim (or a pending dead letter) was there: nothing ran
	DeadLettered int64 // written to dead_letters (the handler gave up, or no valid ID)
	Dropped      int64 // PostgreSQL refused even a minimal dead letter (logged at error level)
}

// String is the stats as one machine-readable line.
func (s ReplayStats) String() string {
	return fmt.Sprintf("replay: seen=%d applied=%d absorbed=%d dead_lettered=%d dropped=%d",
		s.Seen, s.Applied, s.Absorbed, s.DeadLettered, s.Dropped)
}

// ReplayWindow runs the messages of w (a stretch of the log the consumer
// reads, such as a natsjs.Window on its durable's subjects) through the
// consumer's own processing, as if they were delivered again: each is
// claimed in the transaction of its handler's writes, exactly as Run does.
// A message whose claim is there (or whose dead letter is, not replayed) is
// absorbed; one whose claim is missing is applied. It returns once w ends
// (broker.ErrEndOfWindow), with the counts; or when ctx ends or w fails,
// with the counts so far and the error. Running it again is harmless: it
// absorbs what it applied.
//
// It is the remedy for a database that lost committed transactions after
// the broker was acknowledged (an asynchronous PostgreSQL failover promotes
// a standby that had not received them): the claims and the handler's
// writes are gone together, and the broker, acked, delivers nothing again.
// Replaying the window the failover could have erased applies exactly the
// erased messages again. It cannot bring back a message the broker no
// longer holds.
//
// The window's messages run in log order, a batch (up to BatchSize) at a
// time; a failed message is retried in place, with the consumer's backoff,
// before the window moves on, and dead-lettered after MaxAttempts attempts
// as Run would (a failure that is PostgreSQL's is retried until ctx ends).
// A commit whose outcome is unknown is retried too, and counted by what the
// retry finds. ReplayWindow may run while consumers of the same Name run,
// in this process or others: the claims serialize them, so no message is
// applied twice. A replayed message may land after later messages of its
// key that those consumers applied meanwhile; to keep Ordered's order
// across the replay, run it before they start. The consumer's metrics count
// what it applies and absorbs.
func (c *Consumer) ReplayWindow(ctx context.Context, w broker.Window) (ReplayStats, error) {
	var st ReplayStats
	if w == nil {
		return st, fmt.Errorf("%w: ReplayWindow: nil window", ErrInvalidConfig)
	}
	start := time.Now()
	log := c.log.With("window_last", w.Last())
	log.Info("inbox replay of a window started")
	pctx := context.WithoutCancel(ctx) // a batch begun is finished
	for {
		ds, err := w.Receive(ctx, c.cfg.BatchSize)
		if errors.Is(err, broker.ErrEndOfWindow) {
			log.Info("inbox replay of a window done", "seen", st.Seen, "applied", st.Applied, "absorbed", st.Absorbed,
				"dead_lettered", st.DeadLettered, "dropped", st.Dropped, "seconds", time.Since(start).Seconds())
			return st, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return st, fmt.Errorf("inbox: replay window: %w", err)
		}
		items := make([]*item, len(ds))
		for i, d := range ds {
			items[i] = c.decode(d)
			items[i].received = time.Now()
		}
		st.Seen += int64(len(items))
		if err := c.replayBatch(ctx, pctx, items, &st); err != nil {
			return st, err
		}
	}
}

// ReplayWindow is Consumer.ReplayWindow for a process that only replays,
// without a Source: db, h and cfg are those of the consumer whose lost
// effects are to be applied again (the same Name and Schema, the same
// handler). The process's consumers of that Name may run meanwhile.
func ReplayWindow(ctx context.Context, db oncekit.DB, h Handler, cfg *Config, w broker.Window) (ReplayStats, error) {
	c, err := newConsumer(db, nil, h, cfg)
	if err != nil {
		return ReplayStats{}, err
	}
	return c.ReplayWindow(ctx, w)
}

// replayBatch absorbs the messages of items that took effect and runs the
// others, retrying in place until each has an outcome.
func (c *Consumer) replayBatch(ctx, pctx context.Context, items []*item, st *ReplayStats) error {
	pending, err := c.notSettled(pctx, items)
	if err != nil {
		return fmt.Errorf("inbox: replay window: %w", err)
	}
	st.Absorbed += int64(len(items) - len(pending))
	for len(pending) > 0 {
		_, out := c.processOut(pctx, pending)
		var retry []*item
		for i, it := range pending {
			switch out[i].kind {
			case outProcessed:
				st.Applied++
			case outDuplicate:
				st.Absorbed++
			case outDead:
				st.DeadLettered++
			case outDropped:
				st.Dropped++
			case outRetry, outUnknown:
				it.failed = true
				retry = append(retry, it)
			default: // outSkip: waits behind a failure of its key
				retry = append(retry, it)
			}
		}
		if len(retry) > 0 && !c.waitRetry(ctx, retry) {
			return fmt.Errorf("inbox: replay window: %w", ctx.Err())
		}
		pending = retry
	}
	return nil
}

// notSettled returns the messages of items whose claim, or whose dead
// letter not yet replayed, is not in the database. A message dead-lettered
// before is not run again: its handler would fail as before, or apply a
// message an operator has yet to look at.
func (c *Consumer) notSettled(ctx context.Context, items []*item) ([]*item, error) {
	c.verify(items)
	var ids []uuid.UUID
	var raws []string
	for _, it := range items {
		if it.msg != nil {
			ids = append(ids, it.msg.ID)
		}
		if it.rawID != "" {
			raws = append(raws, it.rawID)
		}
	}
	if len(raws) == 0 {
		return items, nil
	}
	done, err := c.store.settledOf(ctx, c.db, c.cfg.Name, ids, raws)
	if err != nil {
		return nil, err
	}
	var out []*item
	for _, it := range items {
		switch {
		case it.msg != nil && done[it.msg.ID.String()]:
		case it.rawID != "" && done[it.rawID]:
		default:
			out = append(out, it)
		}
	}
	return out, nil
}
