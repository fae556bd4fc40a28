package inbox_test

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// oncekit runs the real binary against the test's database and NATS.
func (b *bundle) oncekit(bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"DATABASE_URL=" + testenv.DatabaseURL(), "ONCEKIT_SCHEMA=" + b.db.Schema, "NATS_URL=" + b.nats.URL}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// replay runs `oncekit dlq replay id` until the stream's dedup window lets
// the copy through. Within the window JetStream drops a copy with the same
// Nats-Msg-Id: the replay says so and changes nothing.
func (b *bundle) replay(bin, id string) string {
	b.t.Helper()
	var out string
	var err error
	require.Eventually(b.t, func() bool {
		out, err = b.oncekit(bin, "dlq", "replay", id)
		return err == nil || !strings.Contains(out, "dedup window") // done, or failed otherwise
	}, 30*time.Second, 200*time.Millisecond, "replay still deduplicated")
	require.NoError(b.t, err, out)
	return out
}

// A poison message becomes one dead letter; once the handler is fixed,
// `oncekit dlq replay` gets it processed exactly once.
func TestPoisonDeadLetteredThenReplayedOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the oncekit binary")
	}
	bin := testenv.OncekitBinary(t)
	b := setupStream(t, natsjs.StreamConfig{Duplicates: 2 * time.Second})
	ctx := context.Background()
	var fixed atomic.Bool
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		if string(msg.Payload) == "poison" && !fixed.Load() {
			return inbox.Permanent(errors.New("unknown schema version"))
		}
		return insertEffect(ctx, tx, msg)
	})
	c := b.start(b.source("d", 5*time.Second), h, b.config("c"))
	poison := broker.Message{ID: uuid.New(), Subject: b.subject, Key: "k1", Payload: []byte("poison"), Headers: map[string]string{"X-Tenant": "t1"}}
	b.publish(poison)
	waitStats(t, c, func(s inbox.Stats) bool { return s.DeadLettered == 1 })

	var dlID int64
	var reason string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id, reason FROM dead_letters WHERE message_id = $1`, poison.ID.String()).Scan(&dlID, &reason))
	require.Equal(t, "permanent: unknown schema version", reason)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM dead_letters`))
	require.Zero(t, b.count(`SELECT count(*) FROM processed_messages`), "no claim left behind")

	out, err := b.oncekit(bin, "dlq", "list")
	require.NoError(t, err, out)
	require.Contains(t, out, poison.ID.String())
	require.Contains(t, out, "unknown schema version")
	out, err = b.oncekit(bin, "dlq", "show", strconv.FormatInt(dlID, 10))
	require.NoError(t, err, out)
	require.Contains(t, out, "X-Tenant: t1")

	fixed.Store(true)
	id := strconv.FormatInt(dlID, 10)
	out = b.replay(bin, id)
	require.Contains(t, out, "replayed "+id)

	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })
	require.Equal(t, map[uuid.UUID]int{poison.ID: 1}, b.effects())
	var key string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT key FROM effects`).Scan(&key))
	require.Equal(t, "k1", key, "the replay keeps the ordering key")
	require.Equal(t, 1, b.count(`SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL`))

	// Replaying it again is refused: it is no longer pending.
	out, err = b.oncekit(bin, "dlq", "replay", id)
	require.Error(t, err, out)
	require.Contains(t, out, "not found")

	// Replaying a message that was in fact processed is absorbed as a duplicate.
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts)
		VALUES ('c', $1, $2, 'poison', 'operator error', 1)`, poison.ID.String(), b.subject)
	require.NoError(t, err)
	var second int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT max(id) FROM dead_letters`).Scan(&second))
	b.replay(bin, strconv.FormatInt(second, 10))
	waitStats(t, c, func(s inbox.Stats) bool { return s.Duplicates == 1 })
	require.Equal(t, map[uuid.UUID]int{poison.ID: 1}, b.effects())

	out, err = b.oncekit(bin, "dlq", "prune")
	require.Error(t, err, "prune without a selection is refused")
	out, err = b.oncekit(bin, "dlq", "purge", "--replayed") // the former name of prune
	require.NoError(t, err, out)
	require.Contains(t, out, "deleted 2 dead letters")
	require.Zero(t, b.count(`SELECT count(*) FROM dead_letters`))
}
