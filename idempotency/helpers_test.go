package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// paymentsDDL is the business table the test handlers write.
const paymentsDDL = `CREATE TABLE payments (
	id     uuid PRIMARY KEY,
	tenant text   NOT NULL,
	amount bigint NOT NULL
)`

// harness is one test's PostgreSQL schema, edge and HTTP server.
type harness struct {
	db     *testenv.DB
	edge   *idempotency.Edge
	srv    *httptest.Server
	runs   atomic.Int64 // handler executions
	status atomic.Int64 // status the handler answers (0: 201)
	// failRuns makes the first failRuns executions answer 503.
	failRuns int64
	gate     chan struct{}
	inside   chan struct{} // receives once per execution, when gate is set
	// event, when set, writes the payment's event in the claim's transaction
	// (SameTx mode).
	event func(ctx context.Context, tx pgx.Tx, paymentID uuid.UUID) error
	// provider, when set, is charged for each payment after its row is
	// written; a charge whose answer is lost ends the request unknown.
	provider *fakeProvider
}

// tenantErr is the error the tests' tenant extractor returns without a tenant.
type tenantErr struct{}

func (tenantErr) Error() string   { return "no tenant" }
func (tenantErr) StatusCode() int { return http.StatusUnauthorized }

func tenantFromHeader(r *http.Request) (string, error) {
	t := r.Header.Get("X-Tenant")
	if t == "" {
		return "", tenantErr{}
	}
	return t, nil
}

// newHarness serves POST /payments through the middleware configured by
// route (Operation and Tenant filled in when empty).
func newHarness(t *testing.T, route idempotency.Route, cfg *idempotency.Config) *harness {
	t.Helper()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), paymentsDDL)
	require.NoError(t, err)
	return newHarnessOn(t, db, route, cfg)
}

// newHarnessOn is newHarness on an existing database schema.
func newHarnessOn(t *testing.T, db *testenv.DB, route idempotency.Route, cfg *idempotency.Config) *harness {
	t.Helper()
	h := &harness{db: db}
	var err error
	if cfg == nil {
		cfg = &idempotency.Config{}
	}
	cfg.Schema = h.db.Schema
	h.edge, err = idempotency.New(h.db.Pool, cfg)
	require.NoError(t, err)
	if route.Operation == "" {
		route.Operation = "create-payment"
	}
	if route.Tenant == nil {
		route.Tenant = tenantFromHeader
	}
	mw, err := h.edge.Route(&route)
	require.NoError(t, err)
	status, err := h.edge.StatusHandler(route.Operation)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw(http.HandlerFunc(h.createPayment(h.db.Pool))))
	mux.Handle("GET /idempotency/{digest}", status)
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	return h
}

// createPayment is the business handler: it writes one payments row whose ID
// derives from (tenant, key), in the claim's transaction in SameTx mode or on
// the pool (ON CONFLICT DO NOTHING) in Separate mode.
func (h *harness) createPayment(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		run := h.runs.Add(1)
		if h.gate != nil {
			h.inside <- struct{}{}
			<-h.gate
		}
		var in struct {
			Amount int64 `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if run <= h.failRuns {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		if s := h.status.Load(); s != 0 {
			http.Error(w, "try again", int(s))
			return
		}
		info, ok := idempotency.FromRequest(r)
		if !ok {
			http.Error(w, "no idempotency info", http.StatusInternalServerError)
			return
		}
		id := info.ID()
		const insert = `INSERT INTO payments (id, tenant, amount) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO NOTHING`
		var err error
		if tx, ok := idempotency.Tx(r); ok {
			_, err = tx.Exec(r.Context(), insert, id, info.Tenant, in.Amount)
			if err == nil && h.event != nil {
				err = h.event(r.Context(), tx, id)
			}
		} else {
			_, err = pool.Exec(r.Context(), insert, id, info.Tenant, in.Amount)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		crashpoint.Hit("idempotency.mid-handler") // crash tests: die after the write, inside the handler
		if h.provider != nil {
			if err := h.provider.charge(r.Context(), id.String()); err != nil {
				_ = idempotency.Unknown(r, "charge: "+err.Error())
				http.Error(w, "the provider did not answer", http.StatusBadGateway)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+id.String())
		w.Header().Set("ETag", fmt.Sprintf(`"%d"`, h.runs.Load()))
		w.Header().Set("X-Not-Replayed", "1")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":%q,"tenant":%q,"amount":%d,"run":%d}`, id, info.Tenant, in.Amount, h.runs.Load())
	}
}

// withGate makes every handler execution signal on inside and then block until
// the returned release func is called.
func (h *harness) withGate() (release func()) {
	h.gate = make(chan struct{})
	h.inside = make(chan struct{}, 100)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			close(h.gate)
		}
	}
}

// response is what the client saw.
type response struct {
	status int
	header http.Header
	body   string
}

func (r response) problemCode(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), r.body)
	var p struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	require.Equal(t, r.status, p.Status)
	return p.Code
}

// post sends POST /payments; key "" sends no Idempotency-Key header.
func (h *harness) post(t testing.TB, tenant, key, body string) response {
	t.Helper()
	return post(t, h.srv.URL+"/payments", tenant, key, body)
}

// postInBackground is post for a goroutine other than the test's: a
// failure is reported with t.Errorf (require's FailNow must not be called
// there) and answered as status -1.
func postInBackground(t testing.TB, url, tenant, key, body string) response {
	resp, err := tryPost(url, tenant, key, body)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return response{status: -1, body: err.Error()}
	}
	return resp
}

func post(t testing.TB, url, tenant, key, body string) response {
	t.Helper()
	resp, err := tryPost(url, tenant, key, body)
	assert.NoError(t, err) // t.Errorf: safe in Eventually conditions
	return resp
}

func tryPost(url, tenant, key, body string) (response, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, errors.Join(errors.New("read body"), err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// count runs a count(*) query.
// count runs a count query; it reports a failure with t.Errorf, so that
// Eventually conditions can call it.
func count(t testing.TB, db *testenv.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	assert.NoError(t, db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

var modes = []idempotency.Mode{idempotency.Separate, idempotency.SameTx}
