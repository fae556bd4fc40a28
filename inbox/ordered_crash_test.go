package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/crashpoint"
)

// orderedAckWait is the helper's AckWait: long enough that a restarted
// process works through many later messages before the broker redelivers
// what the killed one held.
const orderedAckWait = 2 * time.Second

// TestOrderedHelperProcess is not a test: it is the ordered consumer
// process TestOrderedSurvivesKills starts (and kills) by re-executing the
// test binary.
func TestOrderedHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "ordered" {
		t.Skip("helper process only")
	}
	pool, src := helperSource(t, orderedAckWait)
	c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(insertEffect), &inbox.Config{
		Name: "c", Schema: os.Getenv("INBOX_SCHEMA"), Ordered: true, BatchSize: 20, Concurrency: 4,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background()) // until killed
}

// Ordered consumer processes of one durable are SIGKILLed again and again
// (at a random commit, before or after it) and restarted at once while a
// stream of many keys is consumed. Every event takes effect once, and the
// effects of each key take effect in the key's stream order, although the
// messages a killed process held come back only after the ack wait, when
// the restarted process (or the other one) has long received later
// messages of their keys.
func TestOrderedSurvivesKills(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts subprocesses")
	}
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprintf("processes=%d", procs), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const keys, events = 40, 2000
			next := make([]int, keys)
			msgs := make([]broker.Message, events)
			for i := range msgs {
				k := rand.IntN(keys)
				next[k]++
				msgs[i] = b.msg(fmt.Sprintf("key-%02d", k), next[k])
			}
			for lo := 0; lo < len(msgs); lo += 500 {
				b.publish(msgs[lo:min(lo+500, len(msgs))]...)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var kills atomic.Int64
			var wg sync.WaitGroup
			for slot := range procs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					b.runKilled(ctx, slot, 6, &kills)
				}()
			}
			require.Eventually(t, func() bool {
				return b.count(`SELECT count(DISTINCT message_id) FROM effects`) == events
			}, 3*time.Minute, 50*time.Millisecond, "every event took effect")
			cancel()
			wg.Wait()
			require.GreaterOrEqual(t, kills.Load(), int64(procs*6), "the processes were killed")

			require.Equal(t, events, b.count(`SELECT count(*) FROM effects`), "each event took effect once")
			rows, err := b.db.Pool.Query(context.Background(), `SELECT key, seq, attempt FROM effects ORDER BY id`)
			require.NoError(t, err)
			last := map[string]int{}
			var late []string
			var key string
			var seq, attempt int
			_, err = pgx.ForEachRow(rows, []any{&key, &seq, &attempt}, func() error {
				if seq < last[key] {
					late = append(late, fmt.Sprintf("%s #%d (attempt %d) after #%d", key, seq, attempt, last[key]))
				}
				last[key] = max(last[key], seq)
				return nil
			})
			require.NoError(t, err)
			t.Logf("%d kills, %d events of %d keys", kills.Load(), events, keys)
			require.Zero(t, len(late), "effects applied out of their key's order, the first: %v", late[:min(len(late), 10)])
		})
	}
}

// runKilled runs ordered helper processes one after another in one slot:
// the first kills of them die at a random commit (SIGKILL, before or after
// it) and are restarted at once; the last one runs until ctx ends.
func (b *bundle) runKilled(ctx context.Context, slot, kills int, killed *atomic.Int64) {
	for round := 0; ctx.Err() == nil; round++ {
		var env []string
		if round < kills {
			point := crashpoint.InboxBeforeCommit
			if (round+slot)%2 == 1 {
				point = crashpoint.InboxAfterCommit
			}
			env = []string{crashpoint.EnvVar + "=" + point, crashpoint.EnvAfter + "=" + strconv.Itoa(2+rand.IntN(6))}
		}
		err := b.helperCmd(ctx, "TestOrderedHelperProcess", "ordered", env...).Run()
		var ee *exec.ExitError
		if ctx.Err() != nil {
			return
		}
		if !errors.As(err, &ee) {
			b.t.Errorf("slot %d: the helper ended without a signal: %v", slot, err)
			return
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			killed.Add(1)
			continue
		}
		b.t.Errorf("slot %d: the helper failed: %v", slot, err)
		return
	}
}
