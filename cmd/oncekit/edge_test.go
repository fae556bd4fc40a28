package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// An operator lists the edge's unknown records and resolves them from the
// command line; the decision is recorded and a retry then replays it.
func TestEdgeCLIListResolve(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	for _, k := range []string{"pay-1", "pay-2"} {
		_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, unknown_reason, expires_at)
			VALUES ('acme', 'create-payment', $1, '\x00', 'unknown', e'charge: EOF\x1b[31m', now() + interval '1 day')`, idempotency.StoredKey(k))
		require.NoError(t, err)
	}

	code, out, stderr := runEffectsCLI(t, db, "edge", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, idempotency.StoredKey("pay-1"))
	require.Contains(t, out, "unknown")
	require.NotContains(t, out, "\x1b", "escapes printed safely")

	code, out, stderr = runEffectsCLI(t, db, "edge", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 2)

	code, out, stderr = runEffectsCLI(t, db, "edge", "resolve", "completed", "--tenant", "acme", "--operation", "create-payment",
		"--stored-key", idempotency.StoredKey("pay-1"), "--status", "201", "--body", `{"id":"p1"}`, "--location", "/payments/p1",
		"--by", "ana", "--reason", "charged, per the provider's dashboard")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "resolved as completed by ana")
	code, _, stderr = runEffectsCLI(t, db, "edge", "resolve", "released", "--tenant", "acme", "--operation", "create-payment",
		"--key", "pay-2", "--by", "ana", "--reason", "never charged")
	require.Equal(t, 0, code, stderr)

	var state, by, headers string
	var status int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state, status_code, response_headers::text, resolved_by FROM idempotency_keys WHERE key = $1`,
		idempotency.StoredKey("pay-1")).Scan(&state, &status, &headers, &by))
	require.Equal(t, "completed", state)
	require.Equal(t, http.StatusCreated, status)
	require.Contains(t, headers, "/payments/p1")
	require.Equal(t, "ana", by)

	code, _, stderr = runEffectsCLI(t, db, "edge", "resolve", "released", "--tenant", "acme", "--operation", "create-payment",
		"--key", "pay-1", "--by", "ana", "--reason", "again")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "not resolvable")

	for _, args := range [][]string{
		{"edge", "resolve", "completed", "--operation", "op", "--key", "k", "--by", "a", "--reason", "r"}, // no --status
		{"edge", "resolve", "released", "--operation", "op", "--by", "a", "--reason", "r"},                // no key
		{"edge", "resolve", "released", "--operation", "op", "--key", "k"},                                // no decision
		{"edge", "resolve", "confirmed", "--operation", "op", "--key", "k", "--by", "a", "--reason", "r"}, // not a state
	} {
		code, _, _ := runEffectsCLI(t, db, args...)
		require.Equal(t, 2, code, args)
	}
}
