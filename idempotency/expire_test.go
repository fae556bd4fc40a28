package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// archive is a Config.OnExpire that records what it is given and fails
// for the digests in failing (all, when down).
type archive struct {
	mu      sync.Mutex
	got     []idempotency.Expired
	failing map[string]bool
	down    bool
}

func (a *archive) onExpire(_ context.Context, x idempotency.Expired) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, x)
	if a.down || a.failing[x.KeyDigest] {
		return errors.New("archive unavailable")
	}
	return nil
}

// take returns and forgets what the archive was given.
func (a *archive) take() []idempotency.Expired {
	a.mu.Lock()
	defer a.mu.Unlock()
	got := a.got
	a.got = nil
	return got
}

// Config.OnExpire is called once per expired body and once per expired
// record, with the key's digest (never the key) and the stored body,
// before Prune lets it go; a record it fails stays for the next pass, and
// an archive that fails a whole batch ends the pass.
func TestOnExpireArchivesBeforeRetentionLetsGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := &archive{failing: map[string]bool{}}
	h := newHarness(t, idempotency.Route{}, &idempotency.Config{OnExpire: a.onExpire, RetentionBatch: 2})
	keys := []string{"pay-1-ac9f1c2e0b7d", "pay-2-ac9f1c2e0b7d", "pay-3-ac9f1c2e0b7d"}
	for _, key := range keys {
		require.Equal(t, http.StatusCreated, h.post(t, "acme", key, `{"amount":100}`).status)
	}
	h.failRuns = h.runs.Load() + 1 // the next request answers 503: released, no body
	require.Equal(t, http.StatusServiceUnavailable, h.post(t, "acme", "pay-4-ac9f1c2e0b7d", `{"amount":100}`).status)
	digest := map[string]string{}
	for _, key := range append(keys, "pay-4-ac9f1c2e0b7d") {
		digest[idempotency.StoredKey(key)] = key
	}

	// The bodies reach their TTL: three calls, the bodies emptied.
	_, err := h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET body_expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, err = h.edge.Prune(ctx)
	require.NoError(t, err)
	got := a.take()
	require.Len(t, got, 3)
	for _, x := range got {
		require.Contains(t, digest, x.KeyDigest, "the hook gets the key's digest")
		require.False(t, x.Deleted)
		require.Equal(t, idempotency.StateCompleted, x.State)
		require.Equal(t, http.StatusCreated, x.StatusCode)
		require.Contains(t, string(x.Body), `"amount":100`)
		require.Equal(t, "acme", x.Tenant)
		require.Equal(t, "create-payment", x.Operation)
	}
	require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE response_body IS NOT NULL`))

	// The records reach their KeyTTL; the archive fails pay-2: it stays.
	a.failing[idempotency.StoredKey("pay-2-ac9f1c2e0b7d")] = true
	_, err = h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, err = h.edge.Prune(ctx)
	require.ErrorContains(t, err, "failed for 1 records")
	got = a.take()
	require.Len(t, got, 4, "each record once in the pass")
	seen := map[string]bool{}
	for _, x := range got {
		require.True(t, x.Deleted)
		require.False(t, seen[x.KeyDigest], "called twice in a pass for %s", digest[x.KeyDigest])
		seen[x.KeyDigest] = true
		for key := range digest {
			require.NotEqual(t, digest[key], x.KeyDigest, "a raw key reached the hook")
		}
	}
	require.Equal(t, 1, count(t, h.db, records), "the record the archive failed is kept")
	require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, idempotency.StoredKey("pay-2-ac9f1c2e0b7d")))

	// Next pass: given again, and gone once the archive takes it.
	delete(a.failing, idempotency.StoredKey("pay-2-ac9f1c2e0b7d"))
	n, err := h.edge.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	got = a.take()
	require.Len(t, got, 1)
	require.Equal(t, idempotency.StoredKey("pay-2-ac9f1c2e0b7d"), got[0].KeyDigest)
	require.Zero(t, count(t, h.db, records))

	// An archive that is down: one batch (RetentionBatch 2) tried per
	// pass, then the pass ends; nothing is let go.
	for i := range 5 {
		require.Equal(t, http.StatusCreated, h.post(t, "acme", "down-"+string(rune('a'+i))+"-ac9f1c2e0b7d", `{"amount":100}`).status)
	}
	_, err = h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second', body_expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	a.down = true
	_, err = h.edge.Prune(ctx)
	require.Error(t, err)
	require.Len(t, a.take(), 2+2, "one failed batch per phase")
	require.Equal(t, 5, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE response_body IS NOT NULL`))
}
