package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/outbox"
)

// The logical relay refuses a second Run while the first runs with the
// error every daemon's Run gives for it, and runs again once it returned.
func TestLogicalRelayRunWhileRunningIsErrAlreadyRunning(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	pub, _ := publisher(t, b.nats.URL)
	r, err := outbox.NewLogicalRelay(b.db.Pool, b.ob, pub, &outbox.LogicalRelayConfig{Logger: testLogger(),
		StatusInterval: 200 * time.Millisecond, Table: outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	for round := range 2 {
		enqueue(t, b.db, b.ob, b.msg("k", round))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		waitCount(t, b.stream, uint64(round+1), 30*time.Second)
		require.ErrorIs(t, r.Run(ctx), oncekit.ErrAlreadyRunning)
		cancel()
		require.NoError(t, <-done)
	}
}
