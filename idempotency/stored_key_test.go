package idempotency_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
)

// lockedBuffer is a log sink safe for the edge's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A client's key is kept as a digest: no column of its record, and no log
// line of the edge (a replay, a mismatch, a release), holds it as it was
// sent, while the lookup stays exact.
func TestKeysAreNeverStoredOrLoggedAsSent(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			logs := &lockedBuffer{}
			log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			h := newHarness(t, idempotency.Route{Mode: mode}, &idempotency.Config{Logger: log})
			const raw = "client-key-7f3a9c"
			require.Equal(t, http.StatusCreated, h.post(t, "acme", raw, `{"amount":100}`).status)
			require.Equal(t, "true", h.post(t, "acme", raw, `{"amount":100}`).header.Get(idempotency.HeaderReplayed))
			require.Equal(t, http.StatusUnprocessableEntity, h.post(t, "acme", raw, `{"amount":5}`).status)
			h.status.Store(http.StatusServiceUnavailable)
			require.Equal(t, http.StatusServiceUnavailable, h.post(t, "acme", raw+"-2", `{"amount":1}`).status)

			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, idempotency.StoredKey(raw)))
			require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_keys k WHERE position($1 IN row_to_json(k)::text) > 0`, raw),
				"a record holds the key as sent")
			require.NotEmpty(t, logs.String())
			require.NotContains(t, logs.String(), raw)
		})
	}
}

// Migration 013 rewrites the keys stored before it as digests: a retry that
// crosses the upgrade is still answered from its record, not run again.
func TestUpgradeTo013KeepsReplaying(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDBAt(t, 12)
	_, err := db.Pool.Exec(ctx, paymentsDDL)
	require.NoError(t, err)
	body := `{"amount":100}`
	fp := idempotency.Fingerprint(http.MethodPost, "create-payment", "/payments", "application/json", []byte(body))
	_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code, response_headers,
		response_body, completed_at, expires_at) VALUES ('acme', 'create-payment', 'pay-before-013', $1, 'completed', 201,
		'{"Content-Type":["application/json"]}', '{"id":"stored"}', now(), now() + interval '1 day')`, fp)
	require.NoError(t, err)
	_, err = migrations.Up(ctx, db.Pool, migrations.WithSchema(db.Schema))
	require.NoError(t, err)

	h := newHarnessOn(t, db, idempotency.Route{}, nil)
	resp := h.post(t, "acme", "pay-before-013", body)
	require.Equal(t, http.StatusCreated, resp.status)
	require.Equal(t, "true", resp.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, `{"id":"stored"}`, resp.body)
	require.Zero(t, h.runs.Load(), "the handler did not run again")
}
