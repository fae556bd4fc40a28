package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
)

func TestProcessesEachMessageOnce(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 20} {
		t.Run(map[int]string{1: "single", 20: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			msgs := make([]broker.Message, 200)
			for i := range msgs {
				msgs[i] = b.msg("", i)
			}
			b.publish(msgs...)
			cfg := b.config("c")
			cfg.BatchSize = batch
			c := b.start(b.source("d", time.Second), inbox.HandlerFunc(insertEffect), cfg)
			waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 200 })
			eff := b.effects()
			require.Len(t, eff, 200)
			for _, m := range msgs {
				require.Equal(t, 1, eff[m.ID])
			}
			require.Equal(t, 200, b.count(`SELECT count(*) FROM processed_messages WHERE consumer = 'c'`))
		})
	}
}

// plainDB hides the pool's SendBatch: the consumer then begins its
// transaction and claims in it, instead of pipelining the claims with BEGIN.
type plainDB struct{ oncekit.DB }

// On a DB without SendBatch the claims are made in the transaction: each
// message takes effect once, and every message delivered again (through a
// second durable, to the same consumer Name) is found claimed.
func TestConsumesOnADBWithoutBatches(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 20} {
		t.Run(map[int]string{1: "single", 20: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			msgs := b.msgs(100)
			b.publish(msgs...)
			cfg := b.config("c")
			cfg.BatchSize = batch
			first := b.startOn(plainDB{b.db.Pool}, b.source("d1", time.Second), inbox.HandlerFunc(insertEffect), cfg)
			waitStats(t, first, func(s inbox.Stats) bool { return s.Processed == 100 })
			again := b.config("c")
			again.BatchSize = batch
			second := b.startOn(plainDB{b.db.Pool}, b.source("d2", time.Second), inbox.HandlerFunc(insertEffect), again)
			waitStats(t, second, func(s inbox.Stats) bool { return s.Duplicates == 100 })
			require.Equal(t, inbox.Stats{Duplicates: 100}, second.Stats())
			eff := b.effects()
			require.Len(t, eff, 100)
			for _, m := range msgs {
				require.Equal(t, 1, eff[m.ID])
			}
		})
	}
}

// A copy of an event republished under a new broker sequence (after the
// broker's dedup window) is absorbed by the claim.
func TestRepublishedCopyIsDuplicate(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 20} {
		t.Run(map[int]string{1: "single", 20: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			b := setupStream(t, natsjs.StreamConfig{Duplicates: 100 * time.Millisecond})
			m := b.msg("", 1)
			first := b.publish(m)[0]
			var again broker.Result
			require.Eventually(t, func() bool { // until the dedup window has passed
				again = b.pub.Publish(context.Background(), []broker.Message{m})[0]
				return again.Err == nil && !again.Duplicate
			}, 10*time.Second, 50*time.Millisecond)
			require.NotEqual(t, first.Sequence, again.Sequence, "a new broker sequence")

			cfg := b.config("c")
			cfg.BatchSize = batch
			cfg.Retention = -1
			c := b.start(b.source("d", time.Second), inbox.HandlerFunc(insertEffect), cfg)
			waitStats(t, c, func(s inbox.Stats) bool { return s.Processed+s.Duplicates == 2 })
			require.Equal(t, inbox.Stats{Processed: 1, Duplicates: 1}, c.Stats())
			require.Equal(t, map[uuid.UUID]int{m.ID: 1}, b.effects())

			reg := cfg.Registerer.(*prometheus.Registry)
			require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP oncekit_inbox_dedup_hit_ratio Duplicates / (processed + duplicates) since the consumer started.
# TYPE oncekit_inbox_dedup_hit_ratio gauge
oncekit_inbox_dedup_hit_ratio{consumer="c"} 0.5
# HELP oncekit_inbox_duplicates_total Messages acknowledged as duplicates of an existing claim.
# TYPE oncekit_inbox_duplicates_total counter
oncekit_inbox_duplicates_total{consumer="c"} 1
# HELP oncekit_inbox_processed_total Messages whose handler committed.
# TYPE oncekit_inbox_processed_total counter
oncekit_inbox_processed_total{consumer="c"} 1
`), "oncekit_inbox_dedup_hit_ratio", "oncekit_inbox_duplicates_total", "oncekit_inbox_processed_total"))
			require.Equal(t, 1, testutil.CollectAndCount(reg, "oncekit_inbox_handler_seconds"))
			require.Equal(t, 1, testutil.CollectAndCount(reg, "oncekit_inbox_batch_size"))
		})
	}
}

// blockFirst returns a handler whose first call blocks until release is
// closed, then writes the effect.
func blockFirst(release <-chan struct{}) inbox.Handler {
	var calls atomic.Int32
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if calls.Add(1) == 1 {
			if err := insertEffect(ctx, tx, msg); err != nil {
				return err
			}
			<-release
			return nil
		}
		return insertEffect(ctx, tx, msg)
	})
}

// The first delivery outlives the ack wait, its in-progress signals lost (a
// stalled process); JetStream redelivers it to another worker, whose claim
// waits for the first transaction and then finds the claim: one effect, one
// duplicate.
func TestRedeliveryAfterAckTimeoutIsDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	cfg := b.config("c")
	cfg.Concurrency = 2
	cfg.Retention = -1
	c := b.start(lostProgress{b.source("d", 500*time.Millisecond)}, blockFirst(release), cfg)
	m := b.msg("", 1)
	b.publish(m)
	b.waitLockWaiter() // the redelivery is blocked on the first claim
	close(release)
	// Under load JetStream may redeliver more than once: every further copy
	// is a duplicate too.
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 && s.Duplicates >= 1 })
	require.Equal(t, map[uuid.UUID]int{m.ID: 1}, b.effects())
}

// Two consumer processes of one durable race on the same message: the first
// one's in-progress signals are lost, so JetStream hands it to the other.
func TestTwoConsumersOfOneDurableRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	h := blockFirst(release)
	var cs []*inbox.Consumer
	for range 2 {
		cfg := b.config("c")
		cfg.Concurrency = 1
		cfg.Retention = -1
		cs = append(cs, b.start(lostProgress{b.sourceOwnConn("d", 500*time.Millisecond)}, h, cfg))
	}
	m := b.msg("", 1)
	b.publish(m)
	b.waitLockWaiter()
	close(release)
	require.Eventually(t, func() bool {
		s0, s1 := cs[0].Stats(), cs[1].Stats()
		return s0.Processed+s1.Processed == 1 && s0.Duplicates+s1.Duplicates >= 1 &&
			s0.Processed+s0.Duplicates >= 1 && s1.Processed+s1.Duplicates >= 1
	}, 30*time.Second, 10*time.Millisecond, "each consumer settles a delivery: the race was real")
	require.Equal(t, map[uuid.UUID]int{m.ID: 1}, b.effects())
}

func TestHandlerFailingTwiceThenSucceeding(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var calls []time.Time
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		mu.Lock()
		calls = append(calls, time.Now())
		mu.Unlock()
		if err := insertEffect(ctx, tx, msg); err != nil {
			return err
		}
		if msg.Attempt < 3 {
			return errors.New("downstream not ready")
		}
		return nil
	})
	cfg := b.config("c")
	cfg.MinBackoff, cfg.MaxBackoff = 200*time.Millisecond, time.Second
	c := b.start(b.source("d", 5*time.Second), h, cfg)
	m := b.msg("", 1)
	b.publish(m)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.Equal(t, inbox.Stats{Processed: 1, Retried: 2}, c.Stats())
	require.Equal(t, map[uuid.UUID]int{m.ID: 1}, b.effects())
	require.Equal(t, 3, b.count(`SELECT attempt FROM effects`), "the effect committed on attempt 3")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 3)
	require.GreaterOrEqual(t, calls[1].Sub(calls[0]), 200*time.Millisecond, "first backoff")
	require.GreaterOrEqual(t, calls[2].Sub(calls[1]), 400*time.Millisecond, "second backoff, doubled")
}

func TestPanicIsRetriedNotFatal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if msg.Attempt == 1 {
			panic("boom")
		}
		return insertEffect(ctx, tx, msg)
	})
	c := b.start(b.source("d", 5*time.Second), h, b.config("c"))
	m := b.msg("", 1)
	b.publish(m)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.Equal(t, inbox.Stats{Processed: 1, Retried: 1}, c.Stats())
	require.Equal(t, map[uuid.UUID]int{m.ID: 1}, b.effects())
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 10} {
		t.Run(map[int]string{1: "single", 10: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var first sync.Once
			var sharedBatch atomic.Int64
			h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
				if batch > 1 {
					// Hold the first batch until every message reached the
					// consumer, so the poison shares a batch with others.
					first.Do(func() { waitDelivered(t, b, 5) })
					if string(msg.Payload) == "poison" {
						// Other messages' claims in this transaction?
						var n int64
						if err := tx.QueryRow(ctx, `SELECT count(*) FROM processed_messages
							WHERE xmin = xid(pg_current_xact_id()) AND message_id <> $1`, msg.ID).Scan(&n); err != nil {
							return err
						}
						sharedBatch.Add(n)
					}
				}
				if err := insertEffect(ctx, tx, msg); err != nil {
					return err
				}
				switch string(msg.Payload) {
				case "poison":
					return inbox.Permanent(errors.New("cannot decode payload"))
				case "flaky":
					return errors.New("always failing")
				}
				return nil
			})
			cfg := b.config("c")
			cfg.BatchSize = batch
			cfg.Concurrency = 1 // one worker: the batches form behind the first
			cfg.MaxAttempts = 3
			poison := broker.Message{ID: uuid.New(), Subject: b.subject, Payload: []byte("poison"), Headers: map[string]string{"X-Tenant": "t1"}}
			flaky := broker.Message{ID: uuid.New(), Subject: b.subject, Payload: []byte("flaky")}
			good := b.msg("", 7)
			b.publish(good, poison, flaky)
			rawPublish(t, b.nats.JS, b.subject, nil, []byte("no id"))
			rawPublish(t, b.nats.JS, b.subject, map[string]string{broker.HeaderEventID: "not-a-uuid"}, []byte("bad id"))
			c := b.start(b.source("d", 5*time.Second), h, cfg)
			waitStats(t, c, func(s inbox.Stats) bool { return s.DeadLettered == 4 && s.Processed == 1 })

			type row struct {
				MessageID, Reason string
				Attempts          int
				Payload           string
			}
			rows, err := b.db.Pool.Query(context.Background(), `SELECT message_id, reason, attempts, convert_from(payload, 'UTF8') FROM dead_letters ORDER BY id`)
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
			require.NoError(t, err)
			require.ElementsMatch(t, []row{
				{poison.ID.String(), "permanent: cannot decode payload", 1, "poison"},
				{flaky.ID.String(), "max attempts reached: always failing", 3, "flaky"},
				{"", inbox.ReasonNoID, 1, "no id"},
				{"not-a-uuid", `invalid message id "not-a-uuid"`, 1, "bad id"},
			}, got)
			require.Equal(t, `"t1"`, func() string {
				var h string
				require.NoError(t, b.db.Pool.QueryRow(context.Background(),
					`SELECT headers->'X-Tenant'->>0 FROM dead_letters WHERE message_id = $1`, poison.ID.String()).Scan(&h))
				return `"` + h + `"`
			}())
			// Dead-lettering leaves no claim and no effect.
			require.Equal(t, 1, b.count(`SELECT count(*) FROM processed_messages`))
			require.Equal(t, map[uuid.UUID]int{good.ID: 1}, b.effects())
			if batch > 1 {
				require.Positive(t, sharedBatch.Load(), "the poison was dead-lettered from a batch")
			}
		})
	}
}

// A batch runs without savepoints; a failing message rolls it back, and the
// batch runs again without it (a savepoint per message), so the failure does
// not undo the others: they commit once, and the failing one is retried
// alone.
func TestBatchWithOneFailingMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := make([]broker.Message, 10)
	for i := range msgs {
		msgs[i] = b.msg("", i)
	}
	failing := msgs[4].ID
	var mu sync.Mutex
	calls := map[uuid.UUID][]int{}
	var committedBeforeRetry, sharedBatch atomic.Int64
	var first sync.Once
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		mu.Lock()
		calls[msg.ID] = append(calls[msg.ID], msg.Attempt)
		mu.Unlock()
		// Hold the first batch until every message reached the consumer,
		// so the failing one shares a batch with others.
		first.Do(func() { waitDelivered(t, b, len(msgs)) })
		if msg.ID == failing && msg.Attempt == 1 {
			// Does this transaction hold other messages' claims too?
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM processed_messages
				WHERE xmin = xid(pg_current_xact_id()) AND message_id <> $1`, failing).Scan(&n); err != nil {
				return err
			}
			sharedBatch.Store(n)
			// A real SQL error: the transaction is aborted.
			_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES (NULL)`)
			if err == nil {
				t.Errorf("inserting NULL succeeded")
				return errors.New("expected an SQL error")
			}
			return err
		}
		if msg.ID == failing {
			var n int64
			if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
				return err
			}
			committedBeforeRetry.Store(n)
		}
		return insertEffect(ctx, tx, msg)
	})
	b.publish(msgs...) // before the consumer starts, so they come as one batch
	cfg := b.config("c")
	cfg.BatchSize = 10
	cfg.Concurrency = 1
	c := b.start(b.source("d", 5*time.Second), h, cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 10 })
	require.Equal(t, inbox.Stats{Processed: 10, Retried: 1}, c.Stats())
	eff := b.effects()
	require.Len(t, eff, 10)
	for _, m := range msgs {
		require.Equal(t, 1, eff[m.ID])
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range msgs {
		if m.ID == failing {
			require.Equal(t, []int{1, 2}, calls[m.ID], "the failing message is retried")
			continue
		}
		// Those that ran before the failure ran again in the batch's
		// second transaction, on the same attempt.
		require.Contains(t, [][]int{{1}, {1, 1}}, calls[m.ID], "the others are not retried")
	}
	require.Positive(t, sharedBatch.Load(), "the failing message ran in a batch with others")
	require.EqualValues(t, 9, committedBeforeRetry.Load(), "the other nine committed before the retry ran alone")
}

func TestOrderedPerKeyUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const keys, perKey = 500, 4
	var msgs []broker.Message
	for seq := 1; seq <= perKey; seq++ {
		for k := range keys {
			msgs = append(msgs, b.msg("key-"+itoa(k), seq))
		}
	}
	b.publish(msgs...)
	// Fail about one first attempt in 25, so in-place retries are exercised.
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if msg.Attempt == 1 && msg.ID[0]%25 == 0 {
			return errors.New("transient")
		}
		return insertEffect(ctx, tx, msg)
	})
	for _, batch := range []int{1, 16, 200} { // 200: runs again in parts after a failure
		cfg := b.config("ordered-" + itoa(batch))
		cfg.Ordered = true
		cfg.Concurrency = 8
		cfg.BatchSize = batch
		cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 20*time.Millisecond
		c := b.start(b.source("d"+itoa(batch), 30*time.Second), h, cfg)
		waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == keys*perKey })
		require.Positive(t, c.Stats().Retried)
		// Effects of one key were written in publication order.
		var bad int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM (
				SELECT seq, lag(seq) OVER (PARTITION BY key ORDER BY id) AS prev FROM effects
			) s WHERE prev IS NOT NULL AND seq <> prev + 1`).Scan(&bad))
		require.Zero(t, bad, "out-of-order effects (batch %d)", batch)
		require.Equal(t, keys*perKey, b.count(`SELECT count(DISTINCT message_id) FROM effects`))
		_, err := b.db.Pool.Exec(context.Background(), `TRUNCATE effects`)
		require.NoError(t, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// Every event arrives twice (the copies carry only Oncekit-Event-Id, so
// JetStream stores both) and two batch consumers of one durable, three
// workers each, race over overlapping batches: each effect exists once.
func TestConcurrentBatchesWithCopiesEffectOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 300
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	for round := range 2 {
		for i, id := range ids {
			rawPublish(t, b.nats.JS, b.subject, map[string]string{broker.HeaderEventID: id.String()}, []byte(strconv.Itoa(i*10+round)))
		}
	}
	var cs []*inbox.Consumer
	for range 2 {
		cfg := b.config("c")
		cfg.BatchSize = 20
		cfg.Concurrency = 3
		cs = append(cs, b.start(b.sourceOwnConn("d", 5*time.Second), inbox.HandlerFunc(insertEffect), cfg))
	}
	require.Eventually(t, func() bool {
		s0, s1 := cs[0].Stats(), cs[1].Stats()
		return s0.Processed+s1.Processed+s0.Duplicates+s1.Duplicates == 2*n
	}, 60*time.Second, 10*time.Millisecond)
	s0, s1 := cs[0].Stats(), cs[1].Stats()
	require.EqualValues(t, n, s0.Processed+s1.Processed)
	require.EqualValues(t, n, s0.Duplicates+s1.Duplicates)
	eff := b.effects()
	require.Len(t, eff, n)
	for _, id := range ids {
		require.Equal(t, 1, eff[id])
	}
}

// A key retrying in place holds only its own lane: every message on the
// other lanes is processed while it waits.
func TestOrderedRetryHoldsOnlyItsLane(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lanes = 4
	laneOfKey := func(k string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(k))
		return h.Sum32() % lanes
	}
	stuck := "key-stuck"
	var others []broker.Message
	stuckMsg := b.msg(stuck, 1)
	msgs := []broker.Message{stuckMsg}
	for k := range 40 {
		key := "key-" + itoa(k)
		for seq := 1; seq <= 10; seq++ {
			m := b.msg(key, seq)
			msgs = append(msgs, m)
			if laneOfKey(key) != laneOfKey(stuck) {
				others = append(others, m)
			}
		}
	}
	require.NotEmpty(t, others)
	b.publish(msgs...)
	var othersDoneFirst atomic.Bool
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if msg.ID == stuckMsg.ID {
			// It fails until the other lanes are done, or for good after
			// 40 attempts (12 s): a stuck lane that held the others would
			// get there with them unfinished.
			var n int
			if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE key <> ALL($1)`, sameLaneKeys(laneOfKey, stuck)).Scan(&n); err != nil {
				return err
			}
			if msg.Attempt < 2 || n < len(others) && msg.Attempt < 40 {
				return errors.New("not yet")
			}
			othersDoneFirst.Store(n == len(others))
		}
		return insertEffect(ctx, tx, msg)
	})
	cfg := b.config("c")
	cfg.Ordered = true
	cfg.Concurrency = lanes
	cfg.BatchSize = 4
	cfg.MinBackoff, cfg.MaxBackoff = 300*time.Millisecond, 300*time.Millisecond
	cfg.MaxAttempts = 50
	c := b.start(b.source("d", 30*time.Second), h, cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == int64(len(msgs)) })
	require.True(t, othersDoneFirst.Load(), "the other lanes finished while the stuck key waited")
}

// sameLaneKeys lists the test's keys that share the stuck key's lane.
func sameLaneKeys(laneOf func(string) uint32, stuck string) []string {
	keys := []string{stuck}
	for k := range 40 {
		if key := "key-" + itoa(k); laneOf(key) == laneOf(stuck) {
			keys = append(keys, key)
		}
	}
	return keys
}

// waitDelivered polls until JetStream has delivered n messages of durable "d"
// (acked or not) to the consumer. It runs on a handler's goroutine, so it
// reports with t.Errorf rather than require.
func waitDelivered(t *testing.T, b *bundle, n int) {
	ctx := context.Background()
	cons, err := b.nats.JS.Consumer(ctx, b.stream, "d")
	if err != nil {
		t.Errorf("consumer: %v", err)
		return
	}
	assert.Eventually(t, func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && int(ci.Delivered.Consumer) >= n
	}, 30*time.Second, 10*time.Millisecond, "JetStream did not deliver %d messages", n)
}

// A failure that is PostgreSQL's (here the handler's connection is
// terminated under it) is retried past MaxAttempts: an outage never
// dead-letters a message.
func TestTransientFailuresAreNeverDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if calls.Add(1) <= 4 {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return fmt.Errorf("insert ledger entry: %w", err)
		}
		return insertEffect(ctx, tx, msg)
	})
	cfg := b.config("c")
	cfg.MaxAttempts = 2
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 10*time.Millisecond
	m := b.msg("", 1)
	b.publish(m)
	c := b.start(b.source("d", 5*time.Second), h, cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.Zero(t, c.Stats().DeadLettered)
	require.Equal(t, 0, b.count(`SELECT count(*) FROM dead_letters`))
	require.Equal(t, map[uuid.UUID]int{m.ID: 1}, b.effects())
}

// On the source's last delivery (a finite MaxDeliver) even a transient
// failure is dead-lettered: the broker would drop the message otherwise.
func TestTransientFailureOnLastDeliveryIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
		return fmt.Errorf("insert ledger entry: %w", err)
	})
	src, err := natsjs.NewSource(context.Background(), b.nats.JS, &natsjs.SourceConfig{
		Stream: b.stream, Durable: "d", AckWait: 5 * time.Second, MaxDeliver: 4,
	})
	require.NoError(t, err)
	t.Cleanup(src.Close)
	cfg := b.config("c")
	cfg.MaxAttempts = 2
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 10*time.Millisecond
	m := b.msg("", 1)
	b.publish(m)
	c := b.start(src, h, cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.DeadLettered == 1 })
	var attempts int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT attempts FROM dead_letters WHERE message_id = $1`, m.ID.String()).Scan(&attempts))
	require.Equal(t, 4, attempts, "dead-lettered on the last delivery, not before")
}
