package idempotency_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// A retry of a completed key is a replay even while another retry of it is
// being answered. A SameTx claim's INSERT … ON CONFLICT DO UPDATE locks the
// row it conflicts with until its transaction ends, whether it takes it or
// not, so a replay holds the completed record's row lock until it rolls
// back; a concurrent retry gave up on that lock after its 1 ms
// lock_timeout and answered 409 IDEMPOTENCY_REQUEST_IN_PROGRESS for a
// request that had completed. (A Separate claim waits for the lock.)
func TestRetryOfACompletedKeyIsAReplayWhileAnotherIsAnswered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Mode: idempotency.SameTx}, nil)
	const body = `{"amount":100}`
	first := h.post(t, "acme", "k-locked", body)
	require.Equal(t, http.StatusCreated, first.status, first.body)

	// The lock a concurrent replay's claim holds on the record
	// while it is answered.
	ctx := context.Background()
	tx, err := h.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var locked int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT FROM idempotency_keys
				WHERE tenant = 'acme' AND key = $1 FOR UPDATE) l`, idempotency.StoredKey("k-locked")).Scan(&locked))
	require.Equal(t, 1, locked)

	again := h.post(t, "acme", "k-locked", body)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, first.body, again.body)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, int64(1), h.runs.Load())
}

// Many concurrent retries of a completed key are all replays.
func TestConcurrentRetriesOfACompletedKeyAreReplays(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const clients, each = 8, 25
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			const body = `{"amount":100}`
			first := h.post(t, "acme", "k-hot", body)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for range each {
						resp := postInBackground(t, h.srv.URL+"/payments", "acme", "k-hot", body)
						if resp.status != http.StatusCreated || resp.header.Get(idempotency.HeaderReplayed) != "true" {
							t.Errorf("retry of a completed key: %d %s", resp.status, resp.body)
							return
						}
					}
				})
			}
			wg.Wait()
			require.Equal(t, int64(1), h.runs.Load())
		})
	}
}
