package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
)

// Ordered mode: a commit whose outcome is unknown (the backend died before
// COMMIT) is settled in place, through the claim, before the next message of
// its key runs; left to the broker's redelivery, it would run after them.
func TestOrderedUnknownCommitKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, second := b.msg("k", 1), b.msg("k", 2)
	var killed atomic.Bool
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		if msg.ID == first.ID && killed.CompareAndSwap(false, true) {
			var pid int
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			if _, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid); err != nil {
				return err
			}
		}
		return nil
	})
	cfg := b.config("c")
	cfg.Ordered = true
	cfg.Concurrency = 2
	c := b.start(b.source("d", 2*time.Second), h, cfg)
	b.publish(first, second)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 2 })
	require.True(t, killed.Load())
	rows, err := b.db.Pool.Query(context.Background(), `SELECT seq FROM effects ORDER BY id`)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, seqs, "the key's messages took effect in order")
}

// Ordered mode: the messages queued behind a key retrying in place are kept
// in progress with the broker, so its ack wait does not redeliver them (each
// redelivery would queue another copy behind the first and spend one of the
// source's MaxDeliver).
func TestOrderedRetryKeepsQueuedMessagesInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stuck := b.msg("k", 0)
	msgs := []broker.Message{stuck}
	for seq := 1; seq <= 5; seq++ {
		msgs = append(msgs, b.msg("k", seq))
	}
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if msg.ID == stuck.ID && msg.Attempt < 3 {
			return errors.New("not yet")
		}
		return insertEffect(ctx, tx, msg)
	})
	// The consumer signals progress every ackWait/3: a long ack wait leaves
	// a late tick on a loaded machine plenty of slack.
	const ackWait = 2 * time.Second
	cfg := b.config("c")
	cfg.Ordered = true
	cfg.Concurrency = 2
	backoff := ackWait + ackWait/4 // each wait outlasts the ack wait
	cfg.MinBackoff, cfg.MaxBackoff = backoff, backoff
	c := b.start(b.source("d", ackWait), h, cfg)
	b.publish(msgs...)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == int64(len(msgs)) })
	require.Zero(t, c.Stats().Duplicates, "no message was redelivered while it waited")
	require.Zero(t, b.count(`SELECT count(*) FROM effects WHERE seq > 0 AND attempt <> 1`))
}

// fetchAndDrop delivers the durable's next message to a client that then
// vanishes without settling it, as a process SIGKILLed while it held the
// message: the broker redelivers it only after the ack wait.
func (b *bundle) fetchAndDrop(durable string) {
	b.t.Helper()
	cons, err := b.nats.JS.Consumer(context.Background(), b.stream, durable)
	require.NoError(b.t, err)
	batch, err := cons.Fetch(1)
	require.NoError(b.t, err)
	n := 0
	for range batch.Messages() {
		n++
	}
	require.NoError(b.t, batch.Error())
	require.Equal(b.t, 1, n)
}

// effectOrder returns the effects' "key/seq" in the order they were written.
func (b *bundle) effectOrder() []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT key || '/' || seq FROM effects ORDER BY id`)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b.t, err)
	return out
}

// A message held by a process that died comes back only after the ack
// wait; the later message of its key, delivered at once to the live
// consumer, waits for it (without spending a delivery attempt), while
// another key goes on.
func TestOrderedWaitsForMessageHeldByDeadProcess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ackWait = 2 * time.Second
	src := b.source("d", ackWait)
	b.publish(b.msg("k", 1))
	b.fetchAndDrop("d")
	b.publish(b.msg("k", 2), b.msg("other", 1))
	cfg := b.config("c")
	cfg.Ordered = true
	c := b.start(src, inbox.HandlerFunc(insertEffect), cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 3 })
	require.Equal(t, []string{"other/1", "k/1", "k/2"}, b.effectOrder())
	require.Positive(t, c.Stats().HeldBack)
	require.Equal(t, 1, b.count(`SELECT attempt FROM effects WHERE key = 'k' AND seq = 2`), "held back without a redelivery")
}

// A pending copy of an event that already took effect (a republished copy
// held by a dead process) does not hold its key back until the ack wait:
// the claim shows it settled.
func TestOrderedDoesNotWaitForCopyOfAppliedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first := b.msg("k", 1)
	// The event took effect long ago: its claim and its effect.
	store, err := inbox.NewStore(b.db.Schema)
	require.NoError(t, err)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	claimed, err := store.Claim(ctx, tx, "c", first.ID)
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, insertEffect(ctx, tx, &inbox.Message{Message: broker.Message{ID: first.ID, Key: "k", Payload: first.Payload}, Attempt: 1}))
	require.NoError(t, tx.Commit(ctx))

	src := b.source("d", time.Minute) // a wait for the copy would outlast the test
	// A copy carrying only the event ID (JetStream stores it again), held
	// by a process that died.
	rawPublish(t, b.nats.JS, b.subject, map[string]string{
		broker.HeaderEventID: first.ID.String(), broker.HeaderKey: "k",
	}, first.Payload)
	b.fetchAndDrop("d")
	b.publish(b.msg("k", 2))
	cfg := b.config("c")
	cfg.Ordered = true
	c := b.start(src, inbox.HandlerFunc(insertEffect), cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.Equal(t, []string{"k/1", "k/2"}, b.effectOrder())
}

// A pending message that was dead-lettered (by a process that died before
// its ack) does not hold its key back until the ack wait.
func TestOrderedDoesNotWaitForDeadLetteredMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	src := b.source("d", time.Minute)
	poison := b.msg("k", 1)
	b.publish(poison)
	b.fetchAndDrop("d")
	store, err := inbox.NewStore(b.db.Schema)
	require.NoError(t, err)
	_, err = store.InsertDeadLetter(context.Background(), b.db.Pool, inbox.DeadLetter{
		Consumer: "c", MessageID: poison.ID.String(), Subject: b.subject, Reason: "permanent: bad", Attempts: 1,
	})
	require.NoError(t, err)
	b.publish(b.msg("k", 2))
	cfg := b.config("c")
	cfg.Ordered = true
	c := b.start(src, inbox.HandlerFunc(insertEffect), cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.Equal(t, []string{"k/2"}, b.effectOrder())
}

// Ordered mode needs a Source that can show the messages other processes
// hold; NewConsumer refuses any other.
func TestOrderedRefusesUnorderedSource(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config("c")
	cfg.Ordered = true
	_, err := inbox.NewConsumer(b.db.Pool, lostProgress{b.source("d", time.Second)}, inbox.HandlerFunc(insertEffect), cfg)
	require.ErrorIs(t, err, inbox.ErrOrderUnsupported)
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
}

// A work-queue stream allows no second reader of the durable's subjects, so
// the consumer cannot see what other processes hold: Run refuses to start
// in ordered mode.
func TestOrderedRefusesUnreadableStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	stream := b.stream + "_wq"
	_, err := b.nats.JS.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{stream + ".>"}, Retention: jetstream.WorkQueuePolicy,
	})
	require.NoError(t, err)
	src, err := natsjs.NewSource(ctx, b.nats.JS, &natsjs.SourceConfig{Stream: stream, Durable: "d"})
	require.NoError(t, err)
	t.Cleanup(src.Close)
	cfg := b.config("c")
	cfg.Ordered = true
	c, err := inbox.NewConsumer(b.db.Pool, src, inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.ErrorIs(t, c.Run(rctx), inbox.ErrOrderUnsupported)
}
