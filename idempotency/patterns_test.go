package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testenv"
)

// Several regions (docs/clients.md): a retry that lands in another region
// runs again when each region answers from its own store; routed to the
// caller's home region, it replays. The two runs wrote the same derived
// payment ID, so once replication brings the regions together a drift
// rule finds the duplicate.
func TestSeveralRegions(t *testing.T) {
	t.Parallel()
	east, west := newHarness(t, idempotency.Route{}, nil), newHarness(t, idempotency.Route{}, nil)
	regions := map[string]*harness{"east": east, "west": west}
	home := map[string]string{"acme": "east"}
	// frontDoor is a region's entry: with homing, it forwards each request
	// to its caller's home region; without, it serves it locally.
	frontDoor := func(local string, homing bool) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			target := regions[local]
			if homing {
				target = regions[home[r.Header.Get("X-Tenant")]]
			}
			u, _ := url.Parse(target.srv.URL)
			httputil.NewSingleHostReverseProxy(u).ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL + "/payments"
	}

	// Homed: the first attempt enters in the west, the retry in the east.
	first := post(t, frontDoor("west", true), "acme", "pay-1", `{"amount":100}`)
	retry := post(t, frontDoor("east", true), "acme", "pay-1", `{"amount":100}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "true", retry.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, first.body, retry.body)
	require.EqualValues(t, 1, east.runs.Load()+west.runs.Load(), "homed: one run")

	// Each region on its own store, the record not yet replicated: the
	// retry in the other region runs again.
	post(t, frontDoor("west", false), "acme", "pay-2", `{"amount":100}`)
	again := post(t, frontDoor("east", false), "acme", "pay-2", `{"amount":100}`)
	require.Empty(t, again.header.Get(idempotency.HeaderReplayed))
	require.EqualValues(t, 3, east.runs.Load()+west.runs.Load(), "unhomed: the retry ran again")

	// Replication brings west's payments into east's view of both regions;
	// the drift rule finds the payment both regions made.
	ctx := context.Background()
	_, err := east.db.Pool.Exec(ctx, `CREATE TABLE payments_all (region text, id uuid, tenant text, amount bigint)`)
	require.NoError(t, err)
	for name, h := range regions {
		rows, err := h.db.Pool.Query(ctx, `SELECT id, tenant, amount FROM payments`)
		require.NoError(t, err)
		for rows.Next() {
			var id, tenant string
			var amount int64
			require.NoError(t, rows.Scan(&id, &tenant, &amount))
			_, err := east.db.Pool.Exec(ctx, `INSERT INTO payments_all VALUES ($1, $2, $3, $4)`, name, id, tenant, amount)
			require.NoError(t, err)
		}
		require.NoError(t, rows.Err())
	}
	checker, err := drift.New(east.db.Pool, &drift.Config{Schema: east.db.Schema, Rules: []drift.Rule{{
		Name: "payments_in_two_regions",
		SQL:  `SELECT id FROM {schema}.payments_all GROUP BY id HAVING count(DISTINCT region) > 1`,
	}}})
	require.NoError(t, err)
	report, err := checker.Run(ctx)
	require.NoError(t, err)
	require.True(t, report.Drifted())
	for _, f := range report.Findings {
		if f.Check == "payments_in_two_regions" {
			require.Equal(t, 1.0, f.Value, "pay-2, made in both regions under one derived ID")
		}
	}
}

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
