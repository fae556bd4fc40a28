package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/wait"
	"github.com/oncekit/oncekit/migrations"
)

// Consumer processes the messages of a Source with a Handler, once each.
type Consumer struct {
	db    oncekit.DB
	src   broker.Source
	h     Handler
	cfg   Config
	store *Store
	gate  *orderGate // ordered mode only
	m     *metrics
	log   *slog.Logger
	watch *pgsql.Watch // the claim and commit statements that cannot succeed as sent
	// syncStandbys says whether a duplicate must wait for the synchronous
	// standbys before it is acked (see commitTx).
	syncStandbys pgsql.SyncStandbys

	retried, dead, heldBack atomic.Int64
	terminated              atomic.Int64
	running                 atomic.Bool
	ackWait                 atomic.Int64 // the source's, learnt at start: how often to signal progress
	maxDeliver              atomic.Int64 // the source's, learnt at start (0: unlimited)
	inHand                  *inHand      // received, not yet settled: kept in progress at the broker

	conflictCooldown atomic.Int64 // > 0: claim with ON CONFLICT (a duplicate was seen lately)
	failureCooldown  atomic.Int64 // > 0: a savepoint per message from the start (a handler failed lately)
}

// NewConsumer returns a Consumer that reads src and runs h for each message
// in a transaction on db (a *pgxpool.Pool). cfg must set at least Name.
func NewConsumer(db oncekit.DB, src broker.Source, h Handler, cfg *Config) (*Consumer, error) {
	if src == nil {
		return nil, fmt.Errorf("%w: db, source and handler are required", ErrInvalidConfig)
	}
	cons, err := newConsumer(db, src, h, cfg)
	if err != nil {
		return nil, err
	}
	if cons.cfg.Ordered && !cons.cfg.Test.DisableOrderGate {
		osrc, ok := src.(broker.OrderedSource)
		if !ok {
			return nil, fmt.Errorf("%w: %T", ErrOrderUnsupported, src)
		}
		cons.gate = newOrderGate(osrc, db, cons.store, cons.cfg.Name, cons.log)
	}
	return cons, nil
}

// newConsumer is NewConsumer without the Source's checks: src may be nil
// (ReplayWindow's consumer, which never runs).
func newConsumer(db oncekit.DB, src broker.Source, h Handler, cfg *Config) (*Consumer, error) {
	if db == nil || h == nil {
		return nil, fmt.Errorf("%w: db, source and handler are required", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	cons := &Consumer{
		db: db, src: src, h: h, cfg: c, store: renderStore(c.Schema),
		m:      newMetrics(c.Registerer, c.Name),
		log:    c.Logger.With("consumer", c.Name),
		inHand: newInHand(),
	}
	cons.watch = pgsql.NewWatch(cons.log, func(statement, class string) {
		cons.m.statementErrors.WithLabelValues(statement, class).Inc()
	})
	return cons, nil
}

// Stats are a consumer's counts since it was created.
type Stats struct {
	Processed    int64 // handlers committed
	Duplicates   int64 // acknowledged as duplicates of an existing claim
	Retried      int64 // handler failures scheduled for another attempt
	DeadLettered int64 // written to dead_letters
	Terminated   int64 // given up on without a dead letter (PostgreSQL refused even a minimal one): terminated at the broker
	HeldBack     int64 // ordered: times a delivery was held back behind an earlier message of its key
}

// Stats returns the consumer's counts so far.
func (c *Consumer) Stats() Stats {
	return Stats{
		Processed:    c.m.nProcessed.Load(),
		Duplicates:   c.m.nDuplicates.Load(),
		Retried:      c.retried.Load(),
		DeadLettered: c.dead.Load(),
		Terminated:   c.terminated.Load(),
		HeldBack:     c.heldBack.Load(),
	}
}

// Healthy reports nil unless a statement the consumer runs for every batch
// (the claim, or the commit with its releases and dead letters) is failing
// in a way that sending it again cannot cure: a missing grant, a table or
// column that is not there, a read-only server, an argument the driver
// cannot encode. The error names the statement, since when it fails and
// PostgreSQL's answer; it wraps oncekit.ErrStatementBroken. Meanwhile the
// messages are retried with backoff, never acked, and each distinct cause
// is logged at error level once a minute and counted in
// oncekit_inbox_statement_errors_total. Healthy turns nil again at the
// statement's next success.
func (c *Consumer) Healthy(context.Context) error { return c.watch.Err() }

// CheckRetention reads the source's limits and returns ErrRetentionTooShort
// when the configured Retention does not exceed the redelivery horizon (see
// Horizon), and ErrInvalidConfig when the source stops redelivering (its
// MaxDeliver) before MaxAttempts: such messages would vanish without a dead
// letter. Run calls it first.
func (c *Consumer) CheckRetention(ctx context.Context) error {
	l, err := c.src.Limits(ctx)
	if err != nil {
		return fmt.Errorf("inbox: read source limits: %w", err)
	}
	c.ackWait.Store(int64(l.AckWait))
	c.maxDeliver.Store(int64(max(l.MaxDeliver, 0)))
	if l.MaxDeliver > 0 && l.MaxDeliver <= c.cfg.MaxAttempts {
		return fmt.Errorf("%w: MaxAttempts %d must be below the source's MaxDeliver %d, or the broker stops redelivering before the consumer dead-letters",
			ErrInvalidConfig, c.cfg.MaxAttempts, l.MaxDeliver)
	}
	h := Horizon(l, c.cfg.MaxAttempts, c.cfg.backoff(c.cfg.MaxAttempts))
	if c.cfg.Retention >= 0 && c.cfg.Retention <= h {
		return fmt.Errorf("%w: Retention %s <= horizon %s (ack wait %s, max deliver %d, dedup window %s, max attempts %d)",
			ErrRetentionTooShort, c.cfg.Retention, h, l.AckWait, l.MaxDeliver, l.Duplicates, c.cfg.MaxAttempts)
	}
	return nil
}

// Run checks the retention against the source's horizon and the role's
// privileges (a *migrations.MissingGrantError names the ones missing), then
// processes messages until ctx ends. Messages in flight when ctx ends are finished
// (their transactions are not cut short, and handlers get a context that is
// not cancelled); messages received but not started are handed back to the
// broker (nak without delay). Run returns nil after a clean stop, and
// ErrSourceClosed if the source was closed under it. Called while another
// Run of c has not returned, it returns oncekit.ErrAlreadyRunning.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return oncekit.ErrAlreadyRunning
	}
	defer c.running.Store(false)
	if err := c.CheckRetention(ctx); err != nil {
		return err
	}
	// A role missing a grant would fail every claim: stop now, naming it.
	// Another error (PostgreSQL unreachable) is the claims' to meet.
	var missing *migrations.MissingGrantError
	if err := migrations.CheckGrants(ctx, c.db, migrations.Consumer, migrations.WithSchema(c.cfg.Schema)); errors.As(err, &missing) {
		return err
	} else if err != nil {
		c.log.Warn("inbox: could not check the role's grants", "err", err)
	}
	if c.gate != nil {
		if err := c.gate.start(ctx); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	if (c.cfg.Retention > 0 && !c.cfg.Test.DisableClaim) || c.cfg.DeadLetterRetention > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); c.retain(ctx) }()
	}
	var feeds []feed
	if c.cfg.Ordered {
		for range c.cfg.Concurrency {
			feeds = append(feeds, newOrderedLane())
		}
	} else {
		feeds = []feed{make(chanFeed, c.cfg.BatchSize*(c.cfg.Concurrency+1))}
	}
	// The messages in hand stay in progress until the workers are done,
	// draining included.
	pctx, stopProgress := context.WithCancel(context.WithoutCancel(ctx))
	progressDone := make(chan struct{})
	go func() { defer close(progressDone); c.keepInProgress(pctx) }()
	var workers sync.WaitGroup
	for i := range c.cfg.Concurrency {
		workers.Add(1)
		go func() { defer workers.Done(); c.work(ctx, feeds[i%len(feeds)]) }()
	}
	err := c.receive(ctx, feeds)
	for _, f := range feeds {
		f.close()
	}
	workers.Wait()
	stopProgress()
	<-progressDone
	wg.Wait()
	c.log.Info("inbox consumer stopped")
	return err
}

// receive reads the source and hands messages to the lanes until ctx ends
// (nil) or the source is closed (ErrSourceClosed).
func (c *Consumer) receive(ctx context.Context, feeds []feed) error {
	c.log.Info("inbox consumer started", "concurrency", c.cfg.Concurrency, "batch_size", c.cfg.BatchSize, "ordered", c.cfg.Ordered)
	failures, lastLog := 0, time.Time{} // consecutive receive failures, and when one was last logged
	for ctx.Err() == nil {
		ds, err := c.src.Receive(ctx, c.cfg.BatchSize)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, broker.ErrSourceClosed) {
				return err
			}
			// A lasting failure is logged when it starts and then every 30 s,
			// not at every retry.
			if failures++; failures == 1 || time.Since(lastLog) >= 30*time.Second {
				c.log.Warn("inbox receive failed", "err", err, "consecutive_failures", failures)
				lastLog = time.Now()
			}
			wait.Sleep(ctx, 250*time.Millisecond)
			continue
		}
		if failures > 0 {
			c.log.Info("inbox receive recovered", "failures", failures)
			failures = 0
		}
		items, now := make([]*item, len(ds)), time.Now()
		for i, d := range ds {
			items[i] = c.decode(d)
			items[i].received = now
		}
		c.inHand.add(items)
		if c.gate != nil {
			c.gate.observe(items)
		}
		for _, it := range items {
			feeds[laneOf(it, len(feeds))].put(it)
		}
	}
	return nil
}

func laneOf(it *item, n int) int {
	if n == 1 {
		return 0
	}
	h := fnv.New32a()
	switch {
	case it.key != "":
		h.Write([]byte(it.key))
	case it.msg != nil:
		h.Write(it.msg.ID[:])
	}
	return int(h.Sum32() % uint32(n))
}

// work processes batches from f until it is closed.
func (c *Consumer) work(ctx context.Context, f feed) {
	pctx := context.WithoutCancel(ctx) // finish what was started
	for {
		batch, ok := f.next(c.cfg.BatchSize)
		if !ok {
			return
		}
		if ctx.Err() != nil {
			// Stopping: hand what was received but not started back to
			// the broker at once.
			c.handBack(pctx, batch)
			continue
		}
		lane, ordered := f.(*orderedLane)
		if ordered && c.gate != nil {
			var held []*item
			batch, held = c.gate.admit(pctx, batch)
			c.heldBack.Add(int64(len(held)))
			c.warnHeldLong(held)
			lane.hold(held)
			if len(batch) == 0 {
				continue
			}
		}
		retry := c.process(pctx, batch)
		// Ordered mode: retry in place so nothing behind overtakes.
		for len(retry) > 0 {
			if !c.waitRetry(ctx, retry) {
				c.handBack(pctx, retry)
				break // stopping: the rest is nakked as it is taken
			}
			retry = c.process(pctx, retry)
		}
		if ordered {
			// The messages held behind these need not wait out their time.
			keys := map[string]bool{}
			for _, it := range batch {
				keys[it.key] = true
			}
			lane.wake(keys)
		}
	}
}

// handBack asks the broker to redeliver items at once.
func (c *Consumer) handBack(ctx context.Context, items []*item) {
	c.inHand.release(items)
	for _, it := range items {
		_ = it.d.Nak(ctx, 0)
	}
}

// waitRetry sleeps for the backoff of the failed messages of retry; it
// reports false if ctx ended first. The messages waiting meanwhile (retry,
// and those queued behind them in the lane) are still in hand, so they are
// kept in progress at the broker.
func (c *Consumer) waitRetry(ctx context.Context, retry []*item) bool {
	var delay time.Duration
	for _, it := range retry {
		if it.failed {
			delay = max(delay, c.cfg.backoff(it.attempt))
			it.attempt++
			it.failed = false
		}
	}
	return wait.Sleep(ctx, delay)
}

// item is one delivery on its way through the consumer.
type item struct {
	d        broker.Delivery
	msg      *Message // nil when the delivery has no valid ID
	rawID    string
	reason   string // dead-letter reason decided before the handler
	key      string // ordering key, even when msg is nil
	seq      uint64 // position in the source's log; 0 when unknown
	dseq     uint64 // position among the source's deliveries; 0 when unknown
	attempt  int
	failed   bool      // ordered retry: this one failed (vs. waits behind one)
	verified bool      // Config.Verifier has looked at it
	received time.Time // when the consumer received it: the in-hand age

	holds     int       // ordered: times held back
	notBefore time.Time // ordered: held back until then
	heldSince time.Time // ordered: first held back
	warnedAt  time.Time // ordered: last logged as held long
}

func (c *Consumer) decode(d broker.Delivery) *item {
	key, raw := identity(d.Header)
	it := &item{d: d, rawID: raw, key: key, attempt: max(d.Attempt(), 1)}
	if sd, ok := d.(broker.SequencedDelivery); ok {
		it.seq, it.dseq = sd.Sequence()
	}
	if raw == "" {
		it.reason = ReasonNoID
		return it
	}
	id, err := uuid.Parse(raw)
	if err != nil || id == uuid.Nil {
		it.reason = invalidID(raw)
		return it
	}
	hs := d.Headers()
	headers := make(map[string]string, len(hs))
	for k, v := range hs {
		if len(v) > 0 {
			headers[k] = v[0]
		}
	}
	it.msg = &Message{
		Message: broker.Message{ID: id, Subject: d.Subject(), Key: key, Payload: d.Data(), Headers: headers},
		Attempt: it.attempt,
	}
	return it
}

// verify authenticates the messages of items with Config.Verifier, on the
// worker (so that signatures are checked in parallel), before any claim. A
// message it refuses is left without a claimable ID and dead-lettered as
// unauthenticated: the event's ID stays free for the genuine event.
func (c *Consumer) verify(items []*item) {
	if c.cfg.Verifier == nil {
		return
	}
	for _, it := range items {
		if it.msg == nil || it.verified {
			continue
		}
		it.verified = true
		if err := c.cfg.Verifier.Verify(&it.msg.Message); err != nil {
			it.msg, it.reason = nil, reasonUnauthenticated+err.Error()
		}
	}
}

func (c *Consumer) logger(it *item) *slog.Logger {
	return c.log.With("message_id", it.rawID, "subject", it.d.Subject(), "attempt", it.attempt)
}
