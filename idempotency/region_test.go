package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// regionDB is a region's own store: a database of its own on the test
// server, dropped at the test's end.
func regionDB(t *testing.T) *testenv.DB {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	require.NoError(t, err)
	name := testenv.Name(t)
	_, err = admin.Exec(ctx, `CREATE DATABASE `+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`)
		_ = admin.Close(context.Background())
	})
	u, err := url.Parse(testenv.DatabaseURL())
	require.NoError(t, err)
	u.Path = "/" + name
	db := testenv.NewDBOn(t, u.String())
	_, err = db.Pool.Exec(ctx, paymentsDDL)
	require.NoError(t, err)
	return db
}

// homes places acme in the east and globex in the west.
func homes(_ context.Context, scope string) (string, error) {
	return map[string]string{"acme": "east", "globex": "west"}[scope], nil
}

// Several regions (docs/clients.md), each edge on its own database: a
// retry that lands in another region than its scope's home is forwarded
// to the home region's edge by the edge itself (west forwards), or refused
// with 421 IDEMPOTENCY_WRONG_REGION (east, which lists no peers), so each
// request runs once overall and the drift rule that would catch a payment
// made in two regions finds none.
func TestSeveralRegions(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.Separate, idempotency.SameTx} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			east := newHarnessOn(t, regionDB(t), idempotency.Route{Mode: mode,
				Homing: &idempotency.Homing{Region: "east", Home: homes}}, nil)
			eastURL, err := url.Parse(east.srv.URL)
			require.NoError(t, err)
			west := newHarnessOn(t, regionDB(t), idempotency.Route{Mode: mode,
				Homing: &idempotency.Homing{Region: "west", Home: homes, Peers: map[string]*url.URL{"east": eastURL}}}, nil)

			// acme's first attempt enters in the west and is forwarded
			// home; its retries, in either region, replay.
			first := post(t, west.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, first.status, first.body)
			for _, region := range []*harness{east, west} {
				retry := post(t, region.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`)
				require.Equal(t, "true", retry.header.Get(idempotency.HeaderReplayed))
				require.Equal(t, first.body, retry.body)
			}
			require.EqualValues(t, 1, east.runs.Load())
			require.EqualValues(t, 0, west.runs.Load(), "west forwarded acme's requests")
			require.Equal(t, 0, count(t, west.db, `SELECT count(*) FROM idempotency_keys`), "west stored nothing of acme's")

			// globex's request in the east, which forwards to no peer, is
			// refused, naming the home region; nothing runs or is stored.
			refused := post(t, east.srv.URL+"/payments", "globex", "pay-2", `{"amount":100}`)
			require.Equal(t, http.StatusMisdirectedRequest, refused.status)
			require.Equal(t, idempotency.CodeWrongRegion, refused.problemCode(t))
			require.Equal(t, "west", refused.header.Get(idempotency.HeaderHomeRegion))
			require.Equal(t, 1, count(t, east.db, `SELECT count(*) FROM idempotency_keys`))
			home := post(t, west.srv.URL+"/payments", "globex", "pay-2", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, home.status)
			require.EqualValues(t, 2, east.runs.Load()+west.runs.Load(), "each request ran once overall")

			// Replication brings west's payments into east's view of both
			// regions: no payment was made in two.
			ctx := context.Background()
			_, err = east.db.Pool.Exec(ctx, `CREATE TABLE payments_all (region text, id uuid, tenant text, amount bigint)`)
			require.NoError(t, err)
			for name, h := range map[string]*harness{"east": east, "west": west} {
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
			require.Equal(t, 2, count(t, east.db, `SELECT count(*) FROM payments_all`))
			checker, err := drift.New(east.db.Pool, &drift.Config{Schema: east.db.Schema, Rules: []drift.Rule{{
				Name: "payments_in_two_regions",
				SQL:  `SELECT id FROM {schema}.payments_all GROUP BY id HAVING count(DISTINCT region) > 1`,
			}}})
			require.NoError(t, err)
			report, err := checker.Run(ctx)
			require.NoError(t, err)
			for _, f := range report.Findings {
				if f.Check == "payments_in_two_regions" {
					require.Zero(t, f.Value, "no payment made in two regions")
				}
			}
		})
	}
}

// A forward that fails (the home region's edge unreachable) answers 502
// IDEMPOTENCY_HOME_REGION_UNREACHABLE and stores nothing in the region it
// reached; the retry, once the home region is back, runs there once.
func TestForwardToAnUnreachableHomeRegion(t *testing.T) {
	t.Parallel()
	east := newHarness(t, idempotency.Route{Homing: &idempotency.Homing{Region: "east", Home: homes}}, nil)
	var down atomic.Bool
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			panic(http.ErrAbortHandler) // the connection drops
		}
		east.srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	frontURL, err := url.Parse(front.URL)
	require.NoError(t, err)
	west := newHarness(t, idempotency.Route{Homing: &idempotency.Homing{Region: "west", Home: homes,
		Peers: map[string]*url.URL{"east": frontURL}}}, nil)

	down.Store(true)
	lost := post(t, west.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`)
	require.Equal(t, http.StatusBadGateway, lost.status)
	require.Equal(t, idempotency.CodeHomeUnreachable, lost.problemCode(t))
	require.Equal(t, 0, count(t, west.db, `SELECT count(*) FROM idempotency_keys`))
	down.Store(false)
	require.Equal(t, http.StatusCreated, post(t, west.srv.URL+"/payments", "acme", "pay-1", `{"amount":100}`).status)
	require.EqualValues(t, 1, east.runs.Load()+west.runs.Load())
}

// A request already forwarded once that reaches another region than its
// home is refused, never forwarded again: two regions that disagree on a
// scope's home cannot send a request back and forth.
func TestForwardedRequestIsNotForwardedAgain(t *testing.T) {
	t.Parallel()
	east := newHarness(t, idempotency.Route{}, nil)
	eastURL, err := url.Parse(east.srv.URL)
	require.NoError(t, err)
	west := newHarness(t, idempotency.Route{Homing: &idempotency.Homing{Region: "west", Home: homes,
		Peers: map[string]*url.URL{"east": eastURL}}}, nil)
	req, err := http.NewRequest(http.MethodPost, west.srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
	require.NoError(t, err)
	req.Header.Set(idempotency.HeaderKey, "pay-1")
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set(idempotency.HeaderForwardedFrom, "north")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
	require.Equal(t, "east", resp.Header.Get(idempotency.HeaderHomeRegion))
	require.EqualValues(t, 0, east.runs.Load()+west.runs.Load())
}

// Hostile region names: a HeaderForwardedFrom that is not one region name
// answers 400 IDEMPOTENCY_REGION_INVALID, and a Homing.Home that fails or
// answers something that is not a region name answers 503
// IDEMPOTENCY_HOME_REGION_UNKNOWN; nothing runs and nothing is stored.
func TestHostileRegionNames(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), paymentsDDL)
	require.NoError(t, err)
	bad := []string{"", strings.Repeat("a", idempotency.MaxRegionLen+1), "\xff\xfe", "ea\x00st", "ea\nst", "ea\tst", "East", "e st"}
	answer := map[string]string{} // scope → what Home answers
	for i, name := range bad {
		answer[fmt.Sprint("scope-", i)] = name
	}
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	mw, err := edge.Route(&idempotency.Route{Operation: "create-payment", Tenant: tenantFromHeader,
		Homing: &idempotency.Homing{Region: "east", Home: func(_ context.Context, scope string) (string, error) {
			if scope == "failing" {
				return "", fmt.Errorf("directory down")
			}
			if name, ok := answer[scope]; ok {
				return name, nil
			}
			return "east", nil
		}}})
	require.NoError(t, err)
	var runs int
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { runs++; w.WriteHeader(http.StatusCreated) }))
	serve := func(scope string, forwarded []string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
		r.Header.Set(idempotency.HeaderKey, "k-1")
		r.Header.Set("X-Tenant", scope)
		if forwarded != nil {
			r.Header[idempotency.HeaderForwardedFrom] = forwarded
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, name := range bad {
		w := serve("acme", []string{name})
		require.Equal(t, http.StatusBadRequest, w.Code, "%q", name)
		require.Contains(t, w.Body.String(), idempotency.CodeRegionInvalid)
	}
	require.Equal(t, http.StatusBadRequest, serve("acme", []string{"west", "north"}).Code, "two headers")
	for scope := range answer {
		w := serve(scope, nil)
		require.Equal(t, http.StatusServiceUnavailable, w.Code, "%q", answer[scope])
		require.Contains(t, w.Body.String(), idempotency.CodeHomeUnknown)
	}
	require.Equal(t, http.StatusServiceUnavailable, serve("failing", nil).Code)
	require.Zero(t, runs)
	require.Equal(t, 0, count(t, db, `SELECT count(*) FROM idempotency_keys`))
	require.Equal(t, http.StatusCreated, serve("acme", []string{"west"}).Code, "a forwarded request at home runs")
}

// Homing's fields are checked when the route is built.
func TestHomingRefusesBadConfig(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	edge, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	peer, _ := url.Parse("http://east.internal")
	for name, h := range map[string]*idempotency.Homing{
		"no region":     {Home: homes},
		"long region":   {Region: strings.Repeat("a", 64), Home: homes},
		"NUL in region": {Region: "we\x00st", Home: homes},
		"no home":       {Region: "west"},
		"bad peer name": {Region: "west", Home: homes, Peers: map[string]*url.URL{"East\xff": peer}},
		"self as peer":  {Region: "west", Home: homes, Peers: map[string]*url.URL{"west": peer}},
		"nil peer URL":  {Region: "west", Home: homes, Peers: map[string]*url.URL{"east": nil}},
		"relative URL":  {Region: "west", Home: homes, Peers: map[string]*url.URL{"east": {Path: "/x"}}},
	} {
		_, err := edge.Route(&idempotency.Route{Operation: "op", SharedScope: true, Homing: h})
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig, name)
		require.ErrorContains(t, err, "Homing", name)
	}
}
