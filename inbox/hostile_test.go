package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/untrusted"
)

// runs counts handler runs by payload.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) add(payload string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[payload]++
}

func (r *runs) of(payload string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[payload]
}

// hostileHandler fails the payloads "fail" (with an error text that is not
// UTF-8), "permanent" and "refuse-me" (permanently), and applies the rest.
func hostileHandler(r *runs) inbox.Handler {
	return inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		p := string(msg.Payload)
		r.add(p)
		switch p {
		case "fail":
			return errors.New("provider said \xff\xfe\x00")
		case "permanent", "refuse-me":
			return inbox.Permanent(errors.New(p + " \xc3"))
		}
		return insertEffect(ctx, tx, msg)
	})
}

// settledAtBroker waits until the durable has no message left to deliver or
// awaiting an ack: nothing is redelivered any more.
func (b *bundle) settledAtBroker(durable string) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		c, err := b.nats.JS.Consumer(context.Background(), b.stream, durable)
		if err != nil {
			return false
		}
		info, err := c.Info(context.Background())
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 30*time.Second, 20*time.Millisecond)
}

// Messages whose ID, headers or failure PostgreSQL's text and jsonb columns
// refuse as they are (an ID that is not UTF-8, an ID wider than an index
// row, a NUL in a header, a handler error that is not UTF-8) are each
// dead-lettered once, within MaxAttempts, and read back exact; the good
// messages of their batches are processed once. Before, the dead letter's
// INSERT failed and took its batch with it, delivery after delivery.
func TestHostileMessagesDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 16} {
		t.Run(map[int]string{1: "one", 16: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			var r runs
			cfg := b.config("c")
			cfg.BatchSize, cfg.MaxAttempts, cfg.Concurrency = batch, 3, 1
			longID := strings.Repeat("x", 5000)
			rawPublish(t, b.nats.JS, b.subject, map[string]string{"Nats-Msg-Id": "id-\xff"}, []byte("bad-id"))
			rawPublish(t, b.nats.JS, b.subject, map[string]string{broker.HeaderEventID: longID}, []byte("long-id"))
			nul := b.msg("", 0)
			nul.Payload, nul.Headers = []byte("permanent"), map[string]string{"X-Nul": "a\x00b", "X-Bin": "\xff"}
			fail := b.msg("", 0)
			fail.Payload = []byte("fail")
			good := b.msgs(20)
			b.publish(append([]broker.Message{nul, fail}, good...)...)
			c := b.start(b.source("d", 5*time.Second), hostileHandler(&r), cfg)

			waitStats(t, c, func(s inbox.Stats) bool { return s.DeadLettered == 4 && s.Processed == 20 })
			b.settledAtBroker("d")
			require.Equal(t, 4, b.count(`SELECT count(*) FROM dead_letters`))
			require.Zero(t, c.Stats().Terminated)
			want := map[uuid.UUID]int{}
			for _, m := range good {
				want[m.ID] = 1
			}
			require.Equal(t, want, b.effects())
			require.LessOrEqual(t, r.of("fail"), 3, "the failing message stops at MaxAttempts")
			require.Equal(t, 1, r.of("permanent"))

			store, err := inbox.NewStore(b.db.Schema)
			require.NoError(t, err)
			dls, err := store.ListDeadLetters(ctx, b.db.Pool, inbox.DeadLetterFilter{})
			require.NoError(t, err)
			byPayload := map[string]inbox.DeadLetter{}
			for _, dl := range dls {
				byPayload[string(dl.Payload)] = dl
				require.True(t, untrusted.Storable(dl.Reason), "%q", dl.Reason)
			}
			require.Equal(t, "id-\xff", byPayload["bad-id"].MessageID, "the raw ID reads back exact")
			require.Equal(t, longID, byPayload["long-id"].MessageID)
			require.Equal(t, []string{"a\x00b"}, byPayload["permanent"].Headers["X-Nul"])
			require.Equal(t, []string{"\xff"}, byPayload["permanent"].Headers["X-Bin"])
			require.Contains(t, byPayload["fail"].Reason, "max attempts reached")
		})
	}
}

// A dead letter PostgreSQL refuses whatever its text (here a CHECK
// constraint an operator added) is settled alone: the message is recorded
// without its subject and headers, or, if even that is refused, terminated
// at the broker and counted; the other messages of its batch commit once,
// and nothing is redelivered.
func TestRefusedDeadLetterSettledAlone(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 16} {
		t.Run(map[int]string{1: "one", 16: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := b.db.Pool.Exec(context.Background(), `ALTER TABLE dead_letters
				ADD CONSTRAINT refuse_subject CHECK (subject NOT LIKE '%.refused'),
				ADD CONSTRAINT refuse_reason CHECK (reason NOT LIKE '%refuse-me%')`)
			require.NoError(t, err)
			var r runs
			cfg := b.config("c")
			cfg.BatchSize, cfg.MaxAttempts, cfg.Concurrency = batch, 3, 1
			noSubject := b.msg("", 0)
			noSubject.Subject, noSubject.Payload = b.stream+".refused", []byte("permanent")
			dropped := b.msg("", 0)
			dropped.Payload = []byte("refuse-me")
			good := b.msgs(20)
			b.publish(append([]broker.Message{noSubject, dropped}, good...)...)
			c := b.start(b.source("d", 5*time.Second), hostileHandler(&r), cfg)

			waitStats(t, c, func(s inbox.Stats) bool { return s.DeadLettered+s.Terminated == 2 && s.Processed == 20 })
			b.settledAtBroker("d")
			require.Equal(t, int64(1), c.Stats().Terminated)
			require.Equal(t, 1, r.of("refuse-me"), "a terminated message is not run again")
			require.Equal(t, 1, r.of("permanent"))
			var subject, reason string
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT subject, reason FROM dead_letters`).Scan(&subject, &reason))
			require.Empty(t, subject, "the minimal record")
			require.Contains(t, reason, "refused by PostgreSQL")
			want := map[uuid.UUID]int{}
			for _, m := range good {
				want[m.ID] = 1
			}
			require.Equal(t, want, b.effects())
		})
	}
}
