package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// A claim can be visible on a primary before its synchronous standby has
// it (its commit's wait cancelled, as pgx does when a connection breaks
// during a COMMIT). A message found claimed is acked as a duplicate only
// once the standby has the claim: acked before, and the failover erasing
// the claim, nothing would redeliver it.
func TestDuplicateIsAckedOnlyOnceTheSynchronousStandbyHasItsClaim(t *testing.T) {
	ctx := context.Background()
	pair := testenv.NewSyncPair(t)
	b := setupOn(t, natsjs.StreamConfig{}, pair.DB)
	// The consumer runs (its start-up writes done) before the standby
	// stops: it applies a first message.
	c := b.start(b.source("d", time.Minute), inbox.HandlerFunc(insertEffect), b.config("c"))
	b.publish(b.msg("", 0))
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed == 1 })

	pair.StopStandby(t)
	m := b.msg("", 1)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('c', $1)`, m.ID)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	testenv.CommitLocally(t, b.db.Pool, tx, pid)
	b.publish(m)
	// The consumer found the claim and waits, in its barrier's commit, for
	// the standby before it acks. (Its connection may be the one the claim
	// was committed on: the pool hands it out again.)
	testenv.WaitSyncRep(t, b.db.Pool, func(_ int, query string) bool { return strings.EqualFold(query, "commit") })
	pending := func() int {
		cons, err := b.nats.JS.Consumer(ctx, b.stream, "d")
		require.NoError(t, err)
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		return info.NumAckPending
	}
	require.Equal(t, 1, pending(), "acked a duplicate whose claim the standby does not have")

	pair.StartStandby(t)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Duplicates == 1 })
	require.Eventually(t, func() bool { return pending() == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Len(t, b.effects(), 1, "the handler ran for the first message only")
}
