package inbox

import (
	"context"
	"log/slog"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// The settle stage of a batch: once its transactions have ended, each
// message is acked, naked or handed back to the broker according to its
// outcome.

// settle acks, naks or returns each message according to its outcome.
func (c *Consumer) settle(ctx context.Context, items []*item, out []outcome) []*item {
	done := settled(items, out, c.cfg.Ordered)
	c.inHand.release(done)
	if c.gate != nil {
		for _, it := range done {
			c.gate.settled(it)
		}
	}
	var processed, dups int
	var retry []*item
	for i, it := range items {
		o := out[i]
		switch o.kind {
		case outProcessed:
			processed++
			c.ack(ctx, it)
		case outDuplicate:
			dups++
			c.ack(ctx, it)
		case outDead:
			c.dead.Add(1)
			c.m.deadLettered.WithLabelValues(o.kindOf).Inc()
			c.logger(it).Warn("inbox message dead-lettered", "reason", o.reason)
			c.ack(ctx, it)
		case outDropped:
			c.terminated.Add(1)
			c.m.terminated.Inc()
			c.term(ctx, it, o.term)
		case outRetry:
			c.retried.Add(1)
			c.m.retried.Inc()
			delay := c.cfg.backoff(it.attempt)
			if pgsql.Broken(o.err) {
				// A statement that cannot succeed as sent: the watch
				// logs it at error level, once per cause and minute.
				c.logger(it).Debug("inbox message not run; retrying", "err", o.err, "delay", delay)
			} else {
				c.logger(it).Warn("inbox handler failed; retrying", "err", o.err, "delay", delay)
			}
			if c.cfg.Ordered {
				it.failed = true
				retry = append(retry, it)
				continue
			}
			if err := it.d.Nak(ctx, delay); err != nil {
				c.logger(it).Warn("inbox nak failed; the broker redelivers after its ack wait", "err", err)
			}
		case outSkip:
			retry = append(retry, it)
		case outUnknown:
			// Never acked: a new attempt's claim settles it (a duplicate
			// if the commit went through). Ordered mode makes that attempt
			// in place, before the key's next messages; otherwise the
			// broker redelivers after its ack wait.
			if c.cfg.Ordered {
				it.failed = true
				retry = append(retry, it)
			}
		}
	}
	c.m.addProcessed(processed)
	c.m.addDuplicates(dups)
	c.m.updateRatio()
	return retry
}

// settled returns the items settle hands over to the broker: all of them,
// but in ordered mode those it keeps to retry in place.
func settled(items []*item, out []outcome, ordered bool) []*item {
	if !ordered {
		return items
	}
	done := make([]*item, 0, len(items))
	for i, it := range items {
		switch out[i].kind {
		case outRetry, outSkip, outUnknown:
		default:
			done = append(done, it)
		}
	}
	return done
}

// term settles it for good: terminated where the broker can (its
// advisory records reason, already made readable and short), acked
// elsewhere.
func (c *Consumer) term(ctx context.Context, it *item, reason string) {
	t, ok := it.d.(broker.Terminator)
	if !ok {
		c.ack(ctx, it)
		return
	}
	if err := t.Term(ctx, reason); err != nil {
		c.logger(it).Warn("inbox term failed; the broker redelivers the message", "err", err)
	}
}

func (c *Consumer) ack(ctx context.Context, it *item) {
	if err := it.d.Ack(ctx); err != nil && c.log.Enabled(ctx, slog.LevelDebug) {
		// A lost ack means a redelivery, which the claim absorbs.
		c.logger(it).Debug("inbox ack failed", "err", err)
	}
}
