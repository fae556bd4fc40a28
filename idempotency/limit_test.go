package idempotency_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// A scope over its NewKeysPerMinute gets 429 with Retry-After for a new key:
// the handler does not run and nothing is stored. Retries of its known keys,
// and other scopes, are not limited.
func TestNewKeysPerScopeAreLimited(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode, NewKeysPerMinute: 2}, nil)
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "k1", `{"amount":1}`).status)
			require.Equal(t, http.StatusCreated, h.post(t, "acme", "k2", `{"amount":2}`).status)
			flood := h.post(t, "acme", "k3", `{"amount":3}`)
			require.Equal(t, http.StatusTooManyRequests, flood.status)
			require.Contains(t, flood.body, idempotency.CodeKeyFlood)
			require.NotEmpty(t, flood.header.Get("Retry-After"))
			require.EqualValues(t, 2, h.runs.Load(), "the third key's handler did not run")
			require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, idempotency.StoredKey("k3")), "nothing stored")

			again := h.post(t, "acme", "k1", `{"amount":1}`)
			require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed), "a known key is not limited")
			require.Equal(t, http.StatusCreated, h.post(t, "globex", "k3", `{"amount":3}`).status, "another scope has its own limit")
		})
	}
}
