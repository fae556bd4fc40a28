package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// An edge whose role lost its grant on idempotency_keys answers every
// request 503 without running it, as before, but logs one error for the
// cause instead of one per request, counts each, and reports it by
// Healthy until a claim succeeds again.
func TestEdgeStatementRefusedIsCountedAndUnhealthy(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.NewDB(t)
			role := testenv.NewRuntimeRole(t, db)
			var logs testenv.SyncBuffer
			reg := prometheus.NewRegistry()
			edge, err := idempotency.New(role.Pool, &idempotency.Config{Schema: db.Schema, Registerer: reg,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, err)
			mw, err := edge.Route(&idempotency.Route{Operation: "pay", Tenant: tenantFromHeader, Mode: mode})
			require.NoError(t, err)
			runs := 0
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				runs++
				w.WriteHeader(http.StatusCreated)
			})))
			t.Cleanup(srv.Close)

			require.NoError(t, edge.Healthy(ctx))
			role.Exec(t, db, `REVOKE INSERT, UPDATE ON idempotency_keys FROM %s`)
			const n = 20
			for i := range n {
				r := post(t, srv.URL, "t1", fmt.Sprintf("key-%d", i), `{"amount":1}`)
				require.Equal(t, http.StatusServiceUnavailable, r.status, r.body)
				require.Equal(t, idempotency.CodeStoreUnavailable, r.problemCode(t))
			}
			require.Zero(t, runs, "nothing ran without its claim")
			got := testenv.Metric(t, reg, "oncekit_idempotency_statement_errors_total", "statement", "store", "class", "42")
			require.Equal(t, float64(n), got)
			herr := edge.Healthy(ctx)
			require.ErrorIs(t, herr, oncekit.ErrStatementBroken)
			require.Contains(t, herr.Error(), "permission denied for table idempotency_keys")
			out := logs.String()
			require.Equal(t, 1, strings.Count(out, "level=ERROR"), "one error line for the cause, however many requests:\n%s", out)
			require.NotContains(t, out, `msg="idempotency: store failed"`)
			t.Logf("Healthy: %v", herr)
			t.Logf("oncekit_idempotency_statement_errors_total{statement=store,class=42} = %v", got)
			t.Logf("log: %s", strings.TrimSpace(out))

			role.Exec(t, db, `GRANT INSERT, UPDATE ON idempotency_keys TO %s`)
			r := post(t, srv.URL, "t1", "key-0", `{"amount":1}`)
			require.Equal(t, http.StatusCreated, r.status, r.body)
			require.Equal(t, 1, runs)
			require.NoError(t, edge.Healthy(ctx))
		})
	}
}
