package sideeffect_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/sideeffect"
)

func TestRecordTwiceInTwoTransactionsIsOneRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	eff := sideeffect.Effect{SourceID: "pay_1", Kind: "email.receipt", Payload: []byte(`{"to":"a@b"}`)}

	tx1, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	first, err := b.ledger.Record(ctx, tx1, eff)
	require.NoError(t, err)
	require.False(t, first.Existing)
	require.Equal(t, oncekit.DeriveKey("pay_1", "email.receipt"), first.Key)

	// The second transaction races the first: its insert waits on the
	// uncommitted row and then finds it.
	type res struct {
		r   sideeffect.Recorded
		err error
	}
	second := make(chan res, 1)
	tx2, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)
	go func() {
		r, err := b.ledger.Record(ctx, tx2, sideeffect.Effect{SourceID: "pay_1", Kind: "email.receipt", Payload: []byte(`other`)})
		second <- res{r, err}
	}()
	// tx2 is blocked on tx1's row until tx1 commits.
	require.Eventually(t, func() bool {
		var waiting int
		_ = b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, `"`+b.db.Schema+`".side_effects`).Scan(&waiting)
		return waiting > 0
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, tx1.Commit(ctx))
	got := <-second
	require.NoError(t, got.err)
	require.True(t, got.r.Existing)
	require.Equal(t, first.ID, got.r.ID)
	require.Equal(t, first.Key, got.r.Key)
	require.NoError(t, tx2.Commit(ctx))

	require.Equal(t, 1, b.countState(t, sideeffect.StatePending))
	row, err := b.ledger.Get(ctx, b.db.Pool, first.ID)
	require.NoError(t, err)
	require.Equal(t, `{"to":"a@b"}`, string(row.Payload), "the first payload is kept")

	// And sequentially, in a third transaction.
	tx3, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	again, err := b.ledger.Record(ctx, tx3, eff)
	require.NoError(t, err)
	require.True(t, again.Existing)
	require.Equal(t, first.ID, again.ID)
	require.NoError(t, tx3.Commit(ctx))
	require.Equal(t, 1, b.countState(t, sideeffect.StatePending))
}

func TestRecordRolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.ledger.Record(ctx, tx, sideeffect.Effect{SourceID: "s", Kind: "k"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, b.countState(t, sideeffect.StatePending))
}

func TestRecordRejectsInvalidEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	for _, e := range []sideeffect.Effect{
		{Kind: "k"}, {SourceID: "s"}, {SourceID: "s", Kind: strings.Repeat("k", sideeffect.MaxKindLen+1)},
	} {
		_, err := b.ledger.Record(ctx, tx, e)
		require.True(t, errors.Is(err, sideeffect.ErrInvalidEffect), "%+v: %v", e, err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := sideeffect.New(&sideeffect.Config{Schema: "Bad-Name"})
	require.ErrorContains(t, err, "Config.Schema")
	b := setup(t)
	p := sideeffect.ProviderFunc(func(context.Context, sideeffect.Call) (string, error) { return "", nil })
	_, err = sideeffect.NewDispatcher(b.db.Pool, b.ledger, map[string]sideeffect.Provider{"k": p},
		&sideeffect.DispatcherConfig{CallTimeout: time.Minute, Lease: time.Second})
	require.ErrorContains(t, err, "DispatcherConfig.Lease")
	_, err = sideeffect.NewDispatcher(b.db.Pool, b.ledger, nil, nil)
	require.ErrorContains(t, err, "no providers")
	require.ErrorIs(t, err, sideeffect.ErrInvalidConfig)
	_, err = sideeffect.NewDispatcher(nil, b.ledger, map[string]sideeffect.Provider{"k": p}, nil)
	require.ErrorIs(t, err, sideeffect.ErrInvalidConfig, "a nil db is a bad argument, typed as such")
	_, err = sideeffect.NewDispatcher(b.db.Pool, nil, map[string]sideeffect.Provider{"k": p}, nil)
	require.ErrorIs(t, err, sideeffect.ErrInvalidConfig, "so is a nil ledger")
	_, err = sideeffect.NewDispatcher(b.db.Pool, b.ledger, map[string]sideeffect.Provider{"k": p}, &sideeffect.DispatcherConfig{Concurrency: -1})
	require.ErrorContains(t, err, "DispatcherConfig.Concurrency")
}
