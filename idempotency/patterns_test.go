package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// Bulk requests (docs/clients.md): one key for the request and an ID per
// item derived from it. A run that fails halfway (503, released) is
// retried with the same key: the items that succeeded are not processed
// again, the others are, and a retry of the completed request replays it.
func TestBulkRequestReprocessesNoItem(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE items (id uuid PRIMARY KEY, ref text NOT NULL)`)
	require.NoError(t, err)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "import-items", Tenant: tenantFromHeader})
	require.NoError(t, err)
	var runs, processed atomic.Int64
	bulk := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		run := runs.Add(1)
		var refs []string
		if err := json.NewDecoder(r.Body).Decode(&refs); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		info, _ := idempotency.FromRequest(r)
		for i, ref := range refs {
			if run == 1 && i == 2 {
				http.Error(w, "the store went away halfway", http.StatusServiceUnavailable)
				return
			}
			id := oncekit.DeriveID(info.ID().String(), ref) // the item's ID, the same on every run
			tag, err := db.Pool.Exec(r.Context(), `INSERT INTO items (id, ref) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, id, ref)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			processed.Add(tag.RowsAffected()) // only an item not processed before
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"items":%d}`, len(refs))
	})
	srv := httptest.NewServer(mw(bulk))
	t.Cleanup(srv.Close)

	body := `["a","b","c","d"]`
	require.Equal(t, http.StatusServiceUnavailable, post(t, srv.URL, "acme", "import-1", body).status)
	require.EqualValues(t, 2, processed.Load(), "a and b went through before the failure")
	done := post(t, srv.URL, "acme", "import-1", body)
	require.Equal(t, http.StatusCreated, done.status)
	require.EqualValues(t, 4, processed.Load(), "the retry processed c and d only")
	require.Equal(t, 4, count(t, db, `SELECT count(*) FROM items`))
	replay := post(t, srv.URL, "acme", "import-1", body)
	require.Equal(t, "true", replay.header.Get(idempotency.HeaderReplayed))
	require.EqualValues(t, 2, runs.Load())
}
