package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// batch is a bulk request's body: the client's own ID per item.
type batch struct {
	Items []struct {
		ID  string `json:"id"`
		Ref string `json:"ref"`
	} `json:"items"`
}

// batchAnswer is the bulk answer: each item's status, and whether it was
// replayed from an earlier run.
type batchAnswer struct {
	Items []struct {
		ID       string          `json:"id"`
		Status   int             `json:"status"`
		Body     json.RawMessage `json:"body"`
		Replayed bool            `json:"replayed"`
	} `json:"items"`
}

// batchCommand validates a batch's items (idempotency.ValidateItems), so
// that a bad one answers 400 before anything is stored.
func batchCommand(_ *http.Request, body []byte) ([]byte, error) {
	var b batch
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, err
	}
	ids := make([]string, len(b.Items))
	for i, it := range b.Items {
		ids[i] = it.ID
	}
	if err := idempotency.ValidateItems(ids); err != nil {
		return nil, err
	}
	return body, nil
}

// bulkWorld serves POST /lines: each item inserts a line (no ON CONFLICT:
// an item run twice to its commit would fail the request) through
// idempotency.Item; failAt makes the item of that index fail (503) while
// failing is set.
type bulkWorld struct {
	db      *testenv.DB
	srv     *httptest.Server
	ran     atomic.Int64 // item functions run
	failAt  int
	failing atomic.Bool
}

func newBulkWorld(t *testing.T, mode idempotency.Mode, failAt int) *bulkWorld {
	t.Helper()
	bw := &bulkWorld{db: testenv.NewDB(t), failAt: failAt}
	ctx := context.Background()
	_, err := bw.db.Pool.Exec(ctx, `CREATE TABLE lines (id uuid PRIMARY KEY, ref text NOT NULL)`)
	require.NoError(t, err)
	edge, err := idempotency.New(bw.db.Pool, &idempotency.Config{Schema: bw.db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "import-lines", Mode: mode, Tenant: tenantFromHeader, Command: batchCommand})
	require.NoError(t, err)
	bw.srv = httptest.NewServer(mw(http.HandlerFunc(bw.serve)))
	t.Cleanup(bw.srv.Close)
	return bw
}

func (bw *bulkWorld) serve(w http.ResponseWriter, r *http.Request) {
	var in batch
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	info, _ := idempotency.FromRequest(r)
	var ans batchAnswer
	for i, it := range in.Items {
		o, err := idempotency.Item(r, it.ID, func(ctx context.Context, tx pgx.Tx) (idempotency.ItemOutcome, error) {
			bw.ran.Add(1)
			if i == bw.failAt && bw.failing.Load() {
				return idempotency.ItemOutcome{}, errors.New("the ledger went away")
			}
			id := info.ItemID(it.ID)
			if _, err := tx.Exec(ctx, `INSERT INTO lines (id, ref) VALUES ($1, $2)`, id, it.Ref); err != nil {
				return idempotency.ItemOutcome{}, err
			}
			return idempotency.ItemOutcome{Status: http.StatusCreated, Body: []byte(fmt.Sprintf(`{"line":%q}`, id))}, nil
		})
		if err != nil {
			http.Error(w, "item "+it.ID+" failed; retry the batch", http.StatusServiceUnavailable)
			return
		}
		ans.Items = append(ans.Items, struct {
			ID       string          `json:"id"`
			Status   int             `json:"status"`
			Body     json.RawMessage `json:"body"`
			Replayed bool            `json:"replayed"`
		}{it.ID, o.Status, o.Body, o.Replayed})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusMultiStatus)
	_ = json.NewEncoder(w).Encode(ans)
}

func batchOf(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"id":"line-%03d","ref":"ref-%d"}`, i+1, i+1)
	}
	return `{"items":[` + strings.Join(items, ",") + `]}`
}

// A batch of n items fails at item k+1 after k ran: in Separate mode the
// k items' outcomes are stored with their writes under the request's
// record, and the retry replays them and runs the n-k others; in SameTx
// mode the failed request's items roll back with it and the retry runs
// all n. Either way each line is written once, the batch's answer then
// replays whole, and no item outcome outlives the completed request.
func TestBatchRetryRunsOnlyTheItemsThatDidNotRun(t *testing.T) {
	t.Parallel()
	const n, k = 6, 3
	for _, mode := range []idempotency.Mode{idempotency.Separate, idempotency.SameTx} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			bw := newBulkWorld(t, mode, k)
			url := bw.srv.URL + "/lines"
			bw.failing.Store(true)
			failed := post(t, url, "acme", "batch-1", batchOf(n))
			require.Equal(t, http.StatusServiceUnavailable, failed.status)
			require.EqualValues(t, k+1, bw.ran.Load(), "k items ran, the next failed")
			kept := map[idempotency.Mode]int{idempotency.Separate: k, idempotency.SameTx: 0}[mode]
			require.Equal(t, kept, count(t, bw.db, `SELECT count(*) FROM lines`))
			require.Equal(t, kept, count(t, bw.db, `SELECT count(*) FROM idempotency_items WHERE status = 201`))

			bw.failing.Store(false)
			done := post(t, url, "acme", "batch-1", batchOf(n))
			require.Equal(t, http.StatusMultiStatus, done.status, done.body)
			var ans batchAnswer
			require.NoError(t, json.Unmarshal([]byte(done.body), &ans))
			require.Len(t, ans.Items, n)
			for i, it := range ans.Items {
				require.Equal(t, http.StatusCreated, it.Status)
				require.Equal(t, i < kept, it.Replayed, "item %d", i)
			}
			require.EqualValues(t, k+1+n-kept, bw.ran.Load(), "the retry ran only the items without an outcome")
			require.Equal(t, n, count(t, bw.db, `SELECT count(*) FROM lines`), "each line once")
			require.Equal(t, 0, count(t, bw.db, `SELECT count(*) FROM idempotency_items`), "outcomes go with the completion")

			replay := post(t, url, "acme", "batch-1", batchOf(n))
			require.Equal(t, "true", replay.header.Get(idempotency.HeaderReplayed))
			require.Equal(t, done.body, replay.body)
			require.EqualValues(t, k+1+n-kept, bw.ran.Load())
		})
	}
}

// An item stored for another request under the key (a different body
// after the first was released) is not replayed to it: the item runs for
// the request that holds the key. The other body itself is refused while
// the key holds the first's fingerprint.
func TestItemOutcomesBelongToTheirRequest(t *testing.T) {
	t.Parallel()
	bw := newBulkWorld(t, idempotency.Separate, 1)
	url := bw.srv.URL + "/lines"
	bw.failing.Store(true)
	require.Equal(t, http.StatusServiceUnavailable, post(t, url, "acme", "batch-1", batchOf(3)).status)
	require.Equal(t, 1, count(t, bw.db, `SELECT count(*) FROM idempotency_items`))
	other := post(t, url, "acme", "batch-1", batchOf(2))
	require.Equal(t, http.StatusUnprocessableEntity, other.status)
	require.Equal(t, idempotency.CodeKeyReused, other.problemCode(t))
	// The released record expires; the key is free for another request,
	// whose item of the same ID runs instead of replaying.
	_, err := bw.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET expires_at = now()`)
	require.NoError(t, err)
	bw.failing.Store(false)
	_, err = bw.db.Pool.Exec(context.Background(), `DELETE FROM lines`)
	require.NoError(t, err)
	done := post(t, url, "acme", "batch-1", batchOf(2))
	require.Equal(t, http.StatusMultiStatus, done.status, done.body)
	require.NotContains(t, done.body, `"replayed":true`)
	require.Equal(t, 2, count(t, bw.db, `SELECT count(*) FROM lines`))
}

// Hostile item IDs (missing, too long, not UTF-8, with NUL or control
// characters, repeated) answer 400 REQUEST_BODY_INVALID from the route's
// Command before anything is stored; Item itself refuses them with an
// *ItemError, storing no outcome; and outside a route, Item refuses with
// ErrNotInRoute.
func TestHostileBatchItems(t *testing.T) {
	t.Parallel()
	bw := newBulkWorld(t, idempotency.Separate, -1)
	url := bw.srv.URL + "/lines"
	for name, id := range map[string]string{
		"missing": "", "long": strings.Repeat("x", idempotency.MaxItemLen+1),
		"NUL": "line\x00-1", "newline": "line\n1", "escape": "line\x1b[2J", "DEL": "line\x7f",
	} {
		raw, err := json.Marshal(id)
		require.NoError(t, err)
		body := `{"items":[{"id":"line-001","ref":"a"},{"id":` + string(raw) + `,"ref":"b"}]}`
		resp := post(t, url, "acme", "hostile-"+strings.ReplaceAll(name, " ", "-"), body)
		require.Equal(t, http.StatusBadRequest, resp.status, name)
		require.Equal(t, idempotency.CodeBodyInvalid, resp.problemCode(t), name)
		require.Contains(t, resp.body, "batch item 1", name)
	}
	dup := post(t, url, "acme", "hostile-dup", `{"items":[{"id":"a","ref":"1"},{"id":"a","ref":"2"}]}`)
	require.Equal(t, http.StatusBadRequest, dup.status)
	require.Contains(t, dup.body, "repeats")
	require.Zero(t, bw.ran.Load())
	require.Equal(t, 0, count(t, bw.db, `SELECT count(*) FROM idempotency_keys`))
	require.Equal(t, 0, count(t, bw.db, `SELECT count(*) FROM idempotency_items`))

	// A batch decoded from JSON holds no invalid UTF-8 (the decoder
	// replaces it); ValidateItems refuses it from any other source.
	for _, id := range []string{"line-\xff", "\xc3", ""} {
		require.ErrorIs(t, idempotency.ValidateItems([]string{"a", id}), idempotency.ErrInvalidItem, "%q", id)
	}
	require.NoError(t, idempotency.ValidateItems([]string{"line-001", "ligne-é", "行-1"}))

	// Item's own check, for a handler without Command.
	edge, err := idempotency.New(bw.db.Pool, &idempotency.Config{Schema: bw.db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "one-item", Tenant: tenantFromHeader})
	require.NoError(t, err)
	var itemErr error
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, itemErr = idempotency.Item(r, "bad\x00id\xff", func(context.Context, pgx.Tx) (idempotency.ItemOutcome, error) {
			t.Error("an invalid item ran")
			return idempotency.ItemOutcome{}, nil
		})
		http.Error(w, itemErr.Error(), http.StatusBadRequest)
	}))
	r := httptest.NewRequest(http.MethodPost, "/one", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, "k-1")
	r.Header.Set("X-Tenant", "acme")
	h.ServeHTTP(httptest.NewRecorder(), r)
	require.ErrorIs(t, itemErr, idempotency.ErrInvalidItem)
	var ie *idempotency.ItemError
	require.ErrorAs(t, itemErr, &ie)
	require.NotContains(t, itemErr.Error(), "\x00", "the error never quotes the item")
	require.Equal(t, 0, count(t, bw.db, `SELECT count(*) FROM idempotency_items`))

	_, err = idempotency.Item(httptest.NewRequest(http.MethodPost, "/", nil), "a", nil)
	require.ErrorIs(t, err, idempotency.ErrNotInRoute)
}

// An item function's outcome out of bounds (a status that is not one, a
// body over MaxItemBodyBytes) fails the item: its writes roll back and
// nothing is stored.
func TestItemOutcomeIsBounded(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "one-item", Tenant: tenantFromHeader})
	require.NoError(t, err)
	for name, o := range map[string]idempotency.ItemOutcome{
		"no status":  {},
		"status 600": {Status: 600},
		"large body": {Status: 201, Body: make([]byte, idempotency.MaxItemBodyBytes+1)},
	} {
		var itemErr error
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, itemErr = idempotency.Item(r, "line-1", func(context.Context, pgx.Tx) (idempotency.ItemOutcome, error) { return o, nil })
			http.Error(w, "no", http.StatusServiceUnavailable)
		}))
		r := httptest.NewRequest(http.MethodPost, "/one", strings.NewReader(name))
		r.Header.Set(idempotency.HeaderKey, "k-"+strings.ReplaceAll(name, " ", "-"))
		r.Header.Set("X-Tenant", "acme")
		h.ServeHTTP(httptest.NewRecorder(), r)
		require.Error(t, itemErr, name)
	}
	require.Equal(t, 0, count(t, db, `SELECT count(*) FROM idempotency_items`))
}

// An owner whose claim was taken over (its token bumped, as a recovery
// does) runs no further item: Item answers ErrOwnershipLost without
// running the item's function, and stores nothing for it.
func TestItemRefusesAFencedOwner(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "import-lines", Tenant: tenantFromHeader})
	require.NoError(t, err)
	var first, second error
	var ran int
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fn := func(context.Context, pgx.Tx) (idempotency.ItemOutcome, error) {
			ran++
			return idempotency.ItemOutcome{Status: http.StatusCreated}, nil
		}
		_, first = idempotency.Item(r, "line-001", fn)
		_, err := db.Pool.Exec(r.Context(), `UPDATE idempotency_keys SET token = token + 1`) // taken over
		require.NoError(t, err)
		_, second = idempotency.Item(r, "line-002", fn)
		http.Error(w, "fenced", http.StatusServiceUnavailable)
	}))
	r := httptest.NewRequest(http.MethodPost, "/lines", strings.NewReader(`{}`))
	r.Header.Set(idempotency.HeaderKey, "k-1")
	r.Header.Set("X-Tenant", "acme")
	h.ServeHTTP(httptest.NewRecorder(), r)
	require.NoError(t, first)
	require.ErrorIs(t, second, idempotency.ErrOwnershipLost)
	require.Equal(t, 1, ran)
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM idempotency_items`))
}

// Two owners of one request at once (the first's lease ran out while its
// item was running, and a retry took the claim over): the second's item
// waits for the first's item transaction, then replays its outcome, so
// the item runs once.
func TestItemRunsOnceAcrossATakeover(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE lines (id uuid PRIMARY KEY, ref text NOT NULL)`)
	require.NoError(t, err)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "import-lines", Tenant: tenantFromHeader})
	require.NoError(t, err)
	inside, gate := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromRequest(r)
		o, err := idempotency.Item(r, "line-001", func(ctx context.Context, tx pgx.Tx) (idempotency.ItemOutcome, error) {
			if runs.Add(1) == 1 {
				inside <- struct{}{}
				<-gate
			}
			_, err := tx.Exec(ctx, `INSERT INTO lines (id, ref) VALUES ($1, 'a')`, info.ItemID("line-001"))
			return idempotency.ItemOutcome{Status: http.StatusCreated}, err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"replayed":%t}`, o.Replayed)
	})))
	t.Cleanup(srv.Close)
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before srv.Close, should the test fail with the gate shut

	firstDone := make(chan response, 1)
	go func() { firstDone <- postInBackground(t, srv.URL, "acme", "batch-1", `{}`) }()
	<-inside
	_, err = db.Pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second'`) // the first owner's lease ran out
	require.NoError(t, err)
	secondDone := make(chan response, 1)
	go func() { secondDone <- postInBackground(t, srv.URL, "acme", "batch-1", `{}`) }()
	require.Eventually(t, func() bool {
		return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE '%' || $1 || '%idempotency_items%'`, db.Schema) == 1
	}, 10*time.Second, 5*time.Millisecond, "the second owner waits on the item")
	open()
	first, second := <-firstDone, <-secondDone
	require.Equal(t, http.StatusOK, first.status, first.body)
	require.Equal(t, http.StatusOK, second.status, second.body)
	require.JSONEq(t, `{"replayed":true}`, second.body)
	require.EqualValues(t, 1, runs.Load())
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM lines`))
}
