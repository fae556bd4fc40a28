package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
)

// poisonPayload makes replayHandler fail for good.
const poisonPayload = "-1"

// replayHandler is insertEffect, but a poison message is dead-lettered.
var replayHandler = inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
	if string(msg.Payload) == poisonPayload {
		return inbox.Permanent(errors.New("poison"))
	}
	return insertEffect(ctx, tx, msg)
})

// eraseEffects deletes what an asynchronous failover erases of the
// messages ids: their claims, their handler's rows and their dead letters,
// all committed and acked at the broker.
func (b *bundle) eraseEffects(consumer string, ids []uuid.UUID) {
	b.t.Helper()
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `DELETE FROM processed_messages WHERE consumer = $1 AND message_id = ANY($2)`, consumer, ids)
	require.NoError(b.t, err)
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM effects WHERE message_id = ANY($1)`, ids)
	require.NoError(b.t, err)
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = id.String()
	}
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM dead_letters WHERE consumer = $1 AND message_id = ANY($2)`, consumer, strs)
	require.NoError(b.t, err)
}

// window opens a window of the test's stream on its subject.
func (b *bundle) window(cfg natsjs.WindowConfig) *natsjs.Window {
	b.t.Helper()
	cfg.Stream, cfg.FilterSubjects = b.stream, []string{b.subject}
	w, err := natsjs.NewWindow(context.Background(), b.nats.JS, cfg)
	require.NoError(b.t, err)
	b.t.Cleanup(w.Close)
	return w
}

func (b *bundle) replayWindow(cfg *inbox.Config, w broker.Window) inbox.ReplayStats {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := inbox.ReplayWindow(ctx, b.db.Pool, replayHandler, cfg, w)
	require.NoError(b.t, err)
	return st
}

// requireEachOnce checks that every message but the poison ones has
// exactly one effect row.
func (b *bundle) requireEachOnce(msgs []broker.Message) {
	b.t.Helper()
	eff := b.effects()
	n := 0
	for _, m := range msgs {
		if string(m.Payload) == poisonPayload {
			continue
		}
		require.Equal(b.t, 1, eff[m.ID], "message %s", m.ID)
		n++
	}
	require.Len(b.t, eff, n)
}

// After an asynchronous failover erased the claims and effects of k
// messages already acked at the broker, nothing redelivers them; replaying
// the window applies exactly those k again, absorbs the others, and a
// second replay applies nothing.
func TestReplayWindowAppliesWhatAFailoverErased(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		batch   int
		ordered bool
	}{{"single", 1, false}, {"batch", 20, false}, {"ordered", 8, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const n, k = 60, 9
			b := setup(t)
			msgs := make([]broker.Message, n)
			for i := range msgs {
				msgs[i] = b.msg(string(rune('a'+i%5)), i)
			}
			// Two poison messages: the failover keeps the first's dead
			// letter and erases the second's.
			msgs[10].Payload, msgs[40].Payload = []byte(poisonPayload), []byte(poisonPayload)
			from := time.Now().Add(-time.Second)
			res := b.publish(msgs...)
			cfg := b.config("c")
			cfg.BatchSize, cfg.Ordered = tc.batch, tc.ordered
			live := b.start(b.source("d", time.Second), replayHandler, cfg)
			waitStats(t, live, func(s inbox.Stats) bool { return s.Processed == n-2 && s.DeadLettered == 2 })

			erased := []uuid.UUID{msgs[40].ID}
			for i := 3; len(erased) < k+1; i += 6 {
				erased = append(erased, msgs[i].ID)
			}
			b.eraseEffects("c", erased)
			require.Len(t, b.effects(), n-2-k, "the failover erased k effects")
			// The broker holds them as acked: the live consumer applies
			// nothing again.
			z := b.msg("z", 1000)
			b.publish(z)
			waitStats(t, live, func(s inbox.Stats) bool { return s.Processed == n-2+1 })
			require.Len(t, b.effects(), n-2-k+1)

			rcfg := func() *inbox.Config {
				c := b.config("c")
				c.BatchSize, c.Ordered = tc.batch, tc.ordered
				return c
			}
			w := b.window(natsjs.WindowConfig{FromSeq: res[0].Sequence, ToSeq: res[n-1].Sequence})
			st := b.replayWindow(rcfg(), w)
			require.Equal(t, inbox.ReplayStats{Seen: n, Applied: k, Absorbed: n - k - 1, DeadLettered: 1}, st)
			b.requireEachOnce(append(msgs, z))
			require.Equal(t, 2, b.count(`SELECT count(*) FROM dead_letters WHERE consumer = 'c'`))

			// Again, by time: nothing left to apply.
			st = b.replayWindow(rcfg(), b.window(natsjs.WindowConfig{FromTime: from}))
			require.Equal(t, inbox.ReplayStats{Seen: n + 1, Absorbed: n + 1}, st)
			b.requireEachOnce(append(msgs, z))
			require.Equal(t, 2, b.count(`SELECT count(*) FROM dead_letters WHERE consumer = 'c'`))
			require.Equal(t, n-2+1, b.count(`SELECT count(*) FROM processed_messages WHERE consumer = 'c'`))
		})
	}
}

// A replay runs beside the live consumers of its Name, over messages they
// are processing at the same time: the claims let each message take effect
// once.
func TestReplayWindowBesideLiveConsumers(t *testing.T) {
	t.Parallel()
	const n, k, more = 100, 20, 200
	b := setup(t)
	// The live consumer is the slower, so that the replays catch up with
	// it on the new messages.
	slow := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.01)`); err != nil {
			return err
		}
		return insertEffect(ctx, tx, msg)
	})
	cfg := b.config("c")
	cfg.Concurrency = 2
	live := b.start(b.source("d", time.Second), slow, cfg)
	msgs := b.msgs(n)
	res := b.publish(msgs...)
	waitStats(t, live, func(s inbox.Stats) bool { return s.Processed == n })
	erased := make([]uuid.UUID, 0, k)
	for i := 0; i < n; i += n / k {
		erased = append(erased, msgs[i].ID)
	}
	b.eraseEffects("c", erased)

	// More messages, which the live consumer and the replays race for:
	// one replay starts at them, the other at the erased ones.
	later := b.msgs(more)
	for i := range later {
		later[i].Payload = []byte("x")
	}
	lres := b.publish(later...)
	var wg sync.WaitGroup
	stats := make([]inbox.ReplayStats, 2)
	seen := []int64{more, n + more}
	for i, from := range []uint64{lres[0].Sequence, res[0].Sequence} {
		w := b.window(natsjs.WindowConfig{FromSeq: from})
		wg.Go(func() {
			rcfg := b.config("c")
			rcfg.BatchSize = 1 + 7*i
			st, err := inbox.ReplayWindow(context.Background(), b.db.Pool, inbox.HandlerFunc(insertEffect), rcfg, w)
			if err != nil {
				t.Errorf("replay %d: %v", i, err)
			}
			stats[i] = st
		})
	}
	wg.Wait()
	waitStats(t, live, func(s inbox.Stats) bool { return s.Processed+s.Duplicates >= n+more })
	b.requireEachOnce(append(msgs, later...))
	applied := live.Stats().Processed - n
	for i, st := range stats {
		require.Equal(t, seen[i], st.Seen, "replay %d", i)
		require.Equal(t, st.Seen, st.Applied+st.Absorbed, "replay %d", i)
		applied += st.Applied
	}
	require.Equal(t, int64(k+more), applied, "each erased or new message applied once, by one of them: live %+v, replays %+v", live.Stats(), stats)
	t.Logf("live applied %d of the new, replays applied %d and %d", live.Stats().Processed-n, stats[0].Applied, stats[1].Applied)
}

func TestReplayWindowRefusesNoWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := inbox.ReplayWindow(context.Background(), b.db.Pool, replayHandler, b.config("c"), nil)
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	_, err = inbox.ReplayWindow(context.Background(), b.db.Pool, replayHandler, &inbox.Config{}, b.window(natsjs.WindowConfig{FromTime: time.Now()}))
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
}

// A replay stops when its context ends, with the counts so far.
func TestReplayWindowStopsWithItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.publish(b.msgs(5)...)
	failing := inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Message) error { return errors.New("down") })
	cfg := b.config("c")
	cfg.MaxAttempts = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	st, err := inbox.ReplayWindow(ctx, b.db.Pool, failing, cfg, b.window(natsjs.WindowConfig{FromSeq: res[0].Sequence}))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, inbox.ReplayStats{Seen: 1}, st)
	require.Zero(t, b.count(`SELECT count(*) FROM processed_messages`))
}
