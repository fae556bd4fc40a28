package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Through PgBouncer in transaction pooling mode, with pgx describing
// nothing (exec) or caching descriptions (cache_describe), the edge claims,
// stores (the headers a jsonb argument) and replays in both modes, and
// refuses another body under the key.
func TestEdgeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, pm := range testenv.PooledModes {
		t.Run(pm, func(t *testing.T) {
			t.Parallel()
			url := testenv.PooledURL(t, pm)
			for _, mode := range modes {
				t.Run(mode.String(), func(t *testing.T) {
					db := testenv.NewDBOn(t, url)
					_, err := db.Pool.Exec(context.Background(), paymentsDDL)
					require.NoError(t, err)
					h := newHarnessOn(t, db, idempotency.Route{Mode: mode}, nil)
					for i := range 20 {
						key := "pay-" + string(rune('a'+i))
						first := h.post(t, "acme", key, `{"amount":100}`)
						require.Equal(t, http.StatusCreated, first.status, first.body)
						again := h.post(t, "acme", key, `{"amount":100}`)
						require.Equal(t, first.status, again.status)
						require.Equal(t, first.body, again.body)
						require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
						require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
						other := h.post(t, "acme", key, `{"amount":999}`)
						require.Equal(t, http.StatusUnprocessableEntity, other.status, other.body)
					}
					require.EqualValues(t, 20, h.runs.Load())
					require.Equal(t, 20, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'completed' AND response_headers IS NOT NULL`))
				})
			}
		})
	}
}
