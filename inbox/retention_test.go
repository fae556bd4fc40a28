package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

func TestHorizon(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		l     broker.SourceLimits
		want  time.Duration
		atts  int
		maxBo time.Duration
	}{
		{"bounded deliveries", broker.SourceLimits{AckWait: 30 * time.Second, MaxDeliver: 10}, 10 * (30*time.Second + time.Minute), 5, time.Minute},
		{"unlimited deliveries use max attempts", broker.SourceLimits{AckWait: 30 * time.Second, MaxDeliver: -1}, 5 * (30*time.Second + time.Minute), 5, time.Minute},
		{"dedup window dominates", broker.SourceLimits{AckWait: time.Second, MaxDeliver: 2, Duplicates: time.Hour}, time.Hour, 1, time.Second},
	} {
		require.Equal(t, tc.want, inbox.Horizon(tc.l, tc.atts, tc.maxBo), tc.name)
	}
}

func TestRunRefusesRetentionShorterThanHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t) // stream dedup window: natsjs.DefaultDuplicates (10 min)
	src := b.source("d", 30*time.Second)

	cfg := b.config("c")
	cfg.MaxAttempts = 5
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Minute
	cfg.Retention = 5 * time.Minute // < dedup window, < 5 × (30 s + 16 s)
	c, err := inbox.NewConsumer(b.db.Pool, src, inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	err = c.Run(context.Background())
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
	require.Contains(t, err.Error(), "horizon 10m0s")

	cfg.Retention = 11 * time.Minute // beyond the horizon: accepted
	c, err = inbox.NewConsumer(b.db.Pool, src, inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	require.NoError(t, c.CheckRetention(context.Background()))

	// A source that stops redelivering before MaxAttempts would drop
	// messages without a dead letter: refused too.
	bounded, err := natsjs.NewSource(context.Background(), b.nats.JS, &natsjs.SourceConfig{Stream: b.stream, Durable: "bounded", MaxDeliver: 3})
	require.NoError(t, err)
	t.Cleanup(bounded.Close)
	c, err = inbox.NewConsumer(b.db.Pool, bounded, inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	require.ErrorIs(t, c.CheckRetention(context.Background()), inbox.ErrInvalidConfig)
}

func TestPruneDeletesOldClaimsInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 25);
		INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'c', gen_random_uuid(), now() FROM generate_series(1, 3);
		INSERT INTO processed_messages (consumer, message_id, processed_at)
		SELECT 'other', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 4);`)
	require.NoError(t, err)

	// A pool of its own, to see every statement the pruning sends.
	log := &testenv.StatementLog{}
	pool := b.db.TracedPool(t, log)

	cfg := b.config("c")
	cfg.Retention = time.Hour
	cfg.RetentionBatch = 10
	c, err := inbox.NewConsumer(pool, b.source("d", time.Second), inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	n, err := c.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 25, n)
	require.Len(t, log.Matching("DELETE FROM"), 3, "one bounded statement per RetentionBatch rows: 10, 10, 5")
	require.Equal(t, 3, b.count(`SELECT count(*) FROM processed_messages WHERE consumer = 'c'`))
	require.Equal(t, 4, b.count(`SELECT count(*) FROM processed_messages WHERE consumer = 'other'`), "another consumer's claims are its own business")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	src := b.source("d", time.Second)
	h := inbox.HandlerFunc(insertEffect)
	for _, tc := range []struct {
		cfg   inbox.Config
		field string
	}{
		{inbox.Config{}, "Name"},
		{inbox.Config{Name: "c", Schema: "Bad-Schema"}, "Schema"},
		{inbox.Config{Name: "c", BatchSize: 5000}, "BatchSize"},
		{inbox.Config{Name: "c", Concurrency: -1}, "Concurrency"},
		{inbox.Config{Name: "c", MaxAttempts: -1}, "MaxAttempts"},
	} {
		_, err := inbox.NewConsumer(b.db.Pool, src, h, &tc.cfg)
		require.ErrorIs(t, err, inbox.ErrInvalidConfig)
		require.Contains(t, err.Error(), tc.field)
	}
}

func TestPruneDeadLettersDeletesOnlyOldReplayedOnesInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts, created_at, replayed_at)
		SELECT 'c', 'old-' || g, 's', '', 'poison', 1, now() - interval '3 hours', now() - interval '2 hours' FROM generate_series(1, 25) g;
		INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts, created_at, replayed_at) VALUES
			('c', 'recent', 's', '', 'poison', 1, now() - interval '3 hours', now() - interval '10 minutes'),
			('c', 'pending', 's', '', 'poison', 1, now() - interval '30 days', NULL),
			('other', 'old', 's', '', 'poison', 1, now() - interval '3 hours', now() - interval '2 hours')`)
	require.NoError(t, err)
	log := &testenv.StatementLog{}
	pool := b.db.TracedPool(t, log)
	cfg := b.config("c")
	cfg.DeadLetterRetention = time.Hour
	cfg.RetentionBatch = 10
	c, err := inbox.NewConsumer(pool, b.source("d", time.Second), inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	n, err := c.PruneDeadLetters(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 25, n)
	require.Equal(t, []int64{10, 10, 5}, deletedRows(log), "one bounded DELETE per RetentionBatch rows")
	require.Equal(t, 2, b.count(`SELECT count(*) FROM dead_letters WHERE consumer = 'c'`), "recent replays and pending dead letters stay")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM dead_letters WHERE consumer = 'c' AND message_id = 'pending'`))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM dead_letters WHERE consumer = 'other'`))

	cfg.DeadLetterRetention = -1
	c, err = inbox.NewConsumer(b.db.Pool, b.source("d2", time.Second), inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	n, err = c.PruneDeadLetters(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestRunPrunesReplayedDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO dead_letters
		(consumer, message_id, subject, payload, reason, attempts, created_at, replayed_at)
		VALUES ('c', 'old', 's', '', 'poison', 1, now() - interval '3 hours', now() - interval '2 hours')`)
	require.NoError(t, err)
	cfg := b.config("c")
	cfg.Retention = -1 // claims kept forever: the sweep still runs for dead letters
	cfg.DeadLetterRetention = time.Hour
	cfg.RetentionInterval = 50 * time.Millisecond
	c, err := inbox.NewConsumer(b.db.Pool, b.source("d", time.Second), inbox.HandlerFunc(insertEffect), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool {
		return b.count(`SELECT count(*) FROM dead_letters`) == 0
	}, 20*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// deletedRows lists the rows each DELETE in log removed.
func deletedRows(log *testenv.StatementLog) []int64 {
	var deleted []int64
	for _, st := range log.Matching("DELETE FROM") {
		deleted = append(deleted, st.Tag.RowsAffected())
	}
	return deleted
}
