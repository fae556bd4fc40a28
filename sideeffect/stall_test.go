package sideeffect

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Recovery reserves its slots at the claim size of the moment. When it
// took them while claims were large and gives them back after the claim
// size has shrunk, the sync loop found too few free slots to claim and
// waits: with no call left to finish, only the give-back can wake it. The
// sync loop must then claim the due effects at once, not stall for good
// with a backlog (seen in `oncekit dispatch` draining 1,000,000 effects,
// where recovery's statement scans the whole due index and takes seconds).
func TestSyncLoopClaimsWhenRecoveryGivesBackSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	l, err := New(&Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := l.Record(ctx, tx, Effect{SourceID: "backlog-1", Kind: "mail", Payload: []byte(`{}`)})
		return err
	}))
	provider := ProviderFunc(func(context.Context, Call) (string, error) { return "", nil })
	d, err := NewDispatcher(db.Pool, l, map[string]Provider{"mail": provider}, &DispatcherConfig{
		Concurrency: 1, BatchSize: 1, PollInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.Equal(t, []string{"mail"}, d.refire, "the kind's expired leases are fired again")

	// A round committed two outcomes: claims of 5 (5×BatchSize), capacity 7.
	// Recovery then reserves 5 slots, as maintainLoop's recover does.
	d.sizeClaims(2)
	held := d.reserve(1)
	require.Equal(t, 5, held)

	jobs := make(chan job, d.capacity())
	results := make(chan outcome)
	loopCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { defer close(stopped); d.syncLoop(loopCtx, jobs, results, func() {}) }()
	defer func() { cancel(); close(results); <-stopped }()

	// The sync loop sizes its claims from its empty round (back to 1, so
	// capacity 3) just before it reserves: 5 slots are held, none is free.
	require.Eventually(t, func() bool { return d.claimSize.Load() == 1 }, 5*time.Second, time.Millisecond)

	// Recovery finds no expired lease and gives its 5 slots back.
	got, err := d.claim(ctx, d.sql.refire, d.refire, held, false, jobs)
	require.NoError(t, err)
	require.Zero(t, got)

	// The poll interval is 10ms: a sync loop still claiming has long
	// claimed the due effect by then.
	select {
	case j := <-jobs:
		require.Equal(t, "mail", j.call.Kind)
	case <-time.After(2 * time.Second):
		t.Fatalf("sync loop did not claim the due effect within 2s after recovery gave back its slots (%d in flight, claim size %d)",
			d.inflight.Load(), d.claimSize.Load())
	}
}
