package sideeffect_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

func TestOperatorRetryAndResolve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	keys := b.record(t, "ops", 3)
	ids := make([]int64, len(keys))
	for i, k := range keys {
		ids[i] = b.rowByKey(t, k).ID
	}
	_, err := b.db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'unknown', attempts = 1 WHERE id = ANY($1)`, ids[:2])
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'failed', attempts = 1 WHERE id = $1`, ids[2])
	require.NoError(t, err)

	list, err := b.ledger.List(ctx, b.db.Pool, sideeffect.Filter{State: sideeffect.StateUnknown})
	require.NoError(t, err)
	require.Len(t, list, 2)
	_, err = b.ledger.List(ctx, b.db.Pool, sideeffect.Filter{State: "bogus"})
	require.Error(t, err)

	d := sideeffect.Decision{By: "ana", Note: "checked the provider"}
	require.Error(t, b.ledger.Resolve(ctx, b.db.Pool, ids[0], sideeffect.StateConfirmed, sideeffect.Decision{By: "ana"}), "why is required")
	require.Error(t, b.ledger.Resolve(ctx, b.db.Pool, ids[0], sideeffect.StatePending, d))
	require.NoError(t, b.ledger.Resolve(ctx, b.db.Pool, ids[0], sideeffect.StateConfirmed, sideeffect.Decision{By: "ana", Note: "seen", ProviderRef: "ch_1"}))
	r, err := b.ledger.Get(ctx, b.db.Pool, ids[0])
	require.NoError(t, err)
	require.Equal(t, sideeffect.StateConfirmed, r.State)
	require.Equal(t, "ch_1", r.ProviderRef)
	require.Equal(t, "ana", r.ResolvedBy)
	require.NotNil(t, r.ResolvedAt)

	err = b.ledger.Resolve(ctx, b.db.Pool, ids[0], sideeffect.StateFailed, d)
	require.True(t, errors.Is(err, sideeffect.ErrWrongState), "%v", err)
	err = b.ledger.Retry(ctx, b.db.Pool, 999999, d)
	require.True(t, errors.Is(err, sideeffect.ErrNotFound), "%v", err)

	// Retry keeps the key: an unknown and a failed effect go back to pending.
	require.NoError(t, b.ledger.Retry(ctx, b.db.Pool, ids[1], d))
	require.NoError(t, b.ledger.Retry(ctx, b.db.Pool, ids[2], d))
	for i, id := range ids[1:] {
		r, err := b.ledger.Get(ctx, b.db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, sideeffect.StatePending, r.State)
		require.Equal(t, keys[i+1], r.Key)
	}
	err = b.ledger.Retry(ctx, b.db.Pool, ids[1], d)
	require.True(t, errors.Is(err, sideeffect.ErrWrongState), "pending cannot be retried: %v", err)
}

// settledEffects records 25 effects of kind "old", 24 of them confirmed 40
// days ago and one unknown, and 5 of kind "new" confirmed now.
func settledEffects(t *testing.T, b *bundle) {
	t.Helper()
	ctx := context.Background()
	b.record(t, "old", 25)
	b.record(t, "new", 5)
	_, err := b.db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'confirmed', created_at = now() - interval '40 days' WHERE kind = 'old'`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'unknown', created_at = now() - interval '40 days'
		WHERE id = (SELECT min(id) FROM side_effects WHERE kind = 'old')`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'confirmed' WHERE kind = 'new'`)
	require.NoError(t, err)
}

func TestPruneDeletesOldTerminalRowsInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	settledEffects(t, b)

	before := time.Now().Add(-30 * 24 * time.Hour)
	log := &testenv.StatementLog{}
	n, err := b.ledger.Prune(ctx, b.db.TracedPool(t, log), before, 10)
	require.NoError(t, err)
	require.Equal(t, int64(24), n)
	require.Len(t, log.Matching("DELETE FROM"), 3, "one bounded statement per 10 rows: 10, 10, 4")
	require.Equal(t, 5, b.countState(t, sideeffect.StateConfirmed), "recent rows stay")
	require.Equal(t, 1, b.countState(t, sideeffect.StateUnknown), "unknown rows are never pruned")
	n, err = b.ledger.Prune(ctx, b.db.Pool, before, 10)
	require.NoError(t, err)
	require.Zero(t, n, "a pass deletes every row past retention")
}

func TestDispatcherPruneDeletesPastRetentionInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	settledEffects(t, b)

	cfg := fastConfig(b)
	cfg.RetentionBatch = 10
	d, err := sideeffect.NewDispatcher(b.db.Pool, b.ledger, map[string]sideeffect.Provider{"old": hook(newReceiver(t), nil)}, cfg)
	require.NoError(t, err)
	n, err := d.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(24), n, "every batch until one deletes fewer than RetentionBatch")
	require.Equal(t, 5, b.countState(t, sideeffect.StateConfirmed), "rows within Retention stay")
	require.Equal(t, 1, b.countState(t, sideeffect.StateUnknown), "unknown rows are never pruned")

	cfg.Retention = -1
	d, err = sideeffect.NewDispatcher(b.db.Pool, b.ledger, map[string]sideeffect.Provider{"old": hook(newReceiver(t), nil)}, cfg)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE side_effects SET created_at = now() - interval '400 days'`)
	require.NoError(t, err)
	n, err = d.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a negative Retention keeps every row")
}

func TestGracefulStopReleasesUncalledRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t)
	b.record(t, "slow", 40)
	started := make(chan struct{}, 100)
	release := make(chan struct{})
	rc.setHook(func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		started <- struct{}{}
		<-release
		return false
	})
	cfg := fastConfig(b)
	cfg.Concurrency = 2
	d, err := sideeffect.NewDispatcher(b.db.Pool, b.ledger, map[string]sideeffect.Provider{"slow": hook(rc, nil)}, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(ctx) }()
	<-started
	<-started
	cancel()       // SIGTERM
	close(release) // the two calls in progress finish during the drain
	require.NoError(t, <-stopped)
	// The two calls are confirmed; the claimed rows never called are back
	// to pending with their attempt not counted.
	require.Equal(t, 2, b.countState(t, sideeffect.StateConfirmed))
	require.Equal(t, 38, b.countState(t, sideeffect.StatePending))
	require.Zero(t, b.countState(t, sideeffect.StateFired))
	var maxAttempts int
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT max(attempts) FROM side_effects WHERE state = 'pending'`).Scan(&maxAttempts))
	require.Zero(t, maxAttempts)
	require.Equal(t, 2, rc.totalCalls())
}
