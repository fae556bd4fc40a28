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
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// fakeProvider is a payment provider over real HTTP: it records each
// charge by its idempotency key, and can drop its answer to the next
// charge (the charge is made; the caller hears nothing).
type fakeProvider struct {
	srv      *httptest.Server
	mu       sync.Mutex
	charges  map[string]int // key → times charged
	dropNext atomic.Bool
}

func newFakeProvider(t *testing.T) *fakeProvider {
	p := &fakeProvider{charges: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		p.charges[key]++
		p.mu.Unlock()
		if p.dropNext.CompareAndSwap(true, false) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close() // charged, and the answer lost
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// charge charges once under key.
func (p *fakeProvider) charge(ctx context.Context, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL+"/charges", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	// No retry of our own: the lost answer must reach the handler.
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("provider answered %d", resp.StatusCode)
	}
	return nil
}

// charged reports whether key was charged.
func (p *fakeProvider) charged(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges[key] > 0
}

func (r response) instance(t *testing.T) string {
	t.Helper()
	var p struct {
		Instance string `json:"instance"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p))
	return p.Instance
}

// A Separate-mode handler whose provider answer is lost ends unknown: the
// request and every retry answer IDEMPOTENCY_OUTCOME_UNKNOWN with the
// status resource's link, never run the handler again nor answer success;
// the status resource says unknown; another body is still refused; the
// outcome is counted and the gauges see it.
func TestLostProviderAnswerEndsUnknown(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			h := newHarness(t, idempotency.Route{Mode: mode, UnknownOutcomes: &idempotency.UnknownOutcomes{StatusPath: "/idempotency/{digest}"}}, &idempotency.Config{Registerer: reg})
			h.provider = newFakeProvider(t)
			h.provider.dropNext.Store(true)

			first := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusConflict, first.status, first.body)
			require.Equal(t, idempotency.CodeOutcomeUnknown, first.problemCode(t))
			link := "/idempotency/" + idempotency.StoredKey("pay-1")
			require.Equal(t, "<"+link+`>; rel="monitor"`, first.header.Get("Link"), "the link names the key's digest, never the key")
			require.Equal(t, link, first.instance(t))
			for range 3 {
				again := h.post(t, "acme", "pay-1", `{"amount":100}`)
				require.Equal(t, idempotency.CodeOutcomeUnknown, again.problemCode(t), "a retry neither runs again nor succeeds blindly")
			}
			require.EqualValues(t, 1, h.runs.Load())
			require.Equal(t, idempotency.CodeKeyReused, h.post(t, "acme", "pay-1", `{"amount":5}`).problemCode(t))

			st := getStatus(t, h.srv.URL+link, "acme")
			require.Equal(t, idempotency.StateUnknown, st.State)
			require.Equal(t, http.StatusNotFound, getStatusCode(t, h.srv.URL+link, "other"), "never another caller's record")
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'unknown' AND unknown_reason LIKE 'charge: %'`))
			if mode == idempotency.SameTx {
				require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM payments`), "the handler's writes commit with the unknown record")
			}

			require.InDelta(t, 1, metricValue(t, reg, "oncekit_idempotency_unknown_outcomes_total"), 0)
			require.InDelta(t, 4, outcomeCount(t, reg, idempotency.OutcomeUnknown), 0)
			_, err := h.edge.Prune(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1.0, metricValue(t, reg, "oncekit_idempotency_unsettled_records"))
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys`), "cleanup never deletes an unknown record")
		})
	}
}

// Reconcile settles an unknown record from what the provider says: charged
// → the rebuilt response is stored and replayed; not charged → the handler
// runs again; no answer → still unknown.
func TestReconcileSettlesUnknown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		charged   bool // the lost charge reached the provider
		noAnswer  bool // reconcile cannot reach the provider
		wantCode  int
		wantRuns  int64
		wantState idempotency.State
	}{
		{name: "settled", charged: true, wantCode: http.StatusCreated, wantRuns: 1, wantState: idempotency.StateCompleted},
		{name: "run-again", wantCode: http.StatusCreated, wantRuns: 2, wantState: idempotency.StateCompleted},
		{name: "still-unknown", noAnswer: true, wantCode: http.StatusConflict, wantRuns: 1, wantState: idempotency.StateUnknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			var reconciled atomic.Int64
			var p *fakeProvider
			route := idempotency.Route{Mode: idempotency.Separate, UnknownOutcomes: &idempotency.UnknownOutcomes{StatusPath: "/idempotency/{digest}",
				Reconcile: func(w http.ResponseWriter, r *http.Request, u idempotency.InDoubt) idempotency.Verdict {
					reconciled.Add(1)
					if u.State != idempotency.StateUnknown || !strings.HasPrefix(u.Reason, "charge: ") || !u.Recovered {
						t.Errorf("reconcile got %+v", u)
					}
					switch {
					case c.noAnswer:
						_ = idempotency.Unknown(r, "provider unreachable")
						return idempotency.StillUnknown
					case p.charged(u.ID().String()):
						w.Header().Set("Location", "/payments/"+u.ID().String())
						w.WriteHeader(http.StatusCreated)
						_, _ = fmt.Fprintf(w, `{"id":%q,"reconciled":true}`, u.ID())
						return idempotency.Settled
					}
					return idempotency.RunAgain
				}}}
			h := newHarness(t, route, &idempotency.Config{Registerer: reg})
			p = newFakeProvider(t)
			h.provider = p
			if !c.charged {
				// The charge never reaches the provider: it is not running.
				h.provider = newFakeProvider(t)
				h.provider.srv.Close()
			} else {
				p.dropNext.Store(true)
			}
			require.Equal(t, idempotency.CodeOutcomeUnknown, h.post(t, "acme", "pay-1", `{"amount":100}`).problemCode(t))
			h.provider = p // the provider is back

			retry := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, c.wantCode, retry.status, retry.body)
			require.EqualValues(t, 1, reconciled.Load())
			require.Equal(t, c.wantRuns, h.runs.Load())
			if c.wantCode == http.StatusCreated {
				replay := h.post(t, "acme", "pay-1", `{"amount":100}`)
				require.Equal(t, "true", replay.header.Get(idempotency.HeaderReplayed))
				require.Equal(t, retry.body, replay.body)
				require.EqualValues(t, 1, reconciled.Load(), "a settled record is replayed, not reconciled again")
			} else {
				require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE unknown_reason = 'provider unreachable'`))
			}
			var state string
			require.NoError(t, h.db.Pool.QueryRow(context.Background(), `SELECT state FROM idempotency_keys`).Scan(&state))
			require.Equal(t, string(c.wantState), state)
		})
	}
}

// A claim whose owner died mid-handler is recovered through Reconcile, not
// by running the handler again blindly.
func TestReconcileRecoversADeadOwnersClaim(t *testing.T) {
	t.Parallel()
	var got []idempotency.InDoubt
	var mu sync.Mutex
	route := idempotency.Route{Mode: idempotency.Separate, Lease: 30 * time.Millisecond,
		UnknownOutcomes: &idempotency.UnknownOutcomes{Reconcile: func(w http.ResponseWriter, r *http.Request, u idempotency.InDoubt) idempotency.Verdict {
			mu.Lock()
			got = append(got, u)
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"reconciled":true}`))
			return idempotency.Settled
		}}}
	h := newHarness(t, route, nil)
	ctx := context.Background()
	// A claim as a dead owner leaves it: in progress, its lease run out.
	_, err := h.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, locked_until, expires_at)
		VALUES ('acme', 'create-payment', $1, $2, 'in_progress', now() - interval '1 second', now() + interval '1 hour')`,
		idempotency.StoredKey("pay-1"),
		idempotency.Fingerprint(http.MethodPost, "create-payment", "/payments", "application/json", []byte(`{"amount":100}`)))
	require.NoError(t, err)

	retry := h.post(t, "acme", "pay-1", `{"amount":100}`)
	require.Equal(t, http.StatusCreated, retry.status, retry.body)
	require.JSONEq(t, `{"reconciled":true}`, retry.body)
	require.Zero(t, h.runs.Load(), "the handler did not run again")
	require.Len(t, got, 1)
	require.Equal(t, idempotency.StateInProgress, got[0].State)
	require.EqualValues(t, 2, got[0].Token)
}

// An operator settles what stays unknown, with the decision recorded; a
// record with nothing to decide is refused with a typed error.
func TestOperatorResolvesUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t, idempotency.Route{Mode: idempotency.Separate}, nil)
	h.provider = newFakeProvider(t)
	h.provider.dropNext.Store(true)
	require.Equal(t, idempotency.CodeOutcomeUnknown, h.post(t, "acme", "pay-1", `{"amount":100}`).problemCode(t))
	h.provider.dropNext.Store(true)
	require.Equal(t, idempotency.CodeOutcomeUnknown, h.post(t, "acme", "pay-2", `{"amount":100}`).problemCode(t))

	list, err := h.edge.Unsettled(ctx, h.db.Pool, "create-payment", 10)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, idempotency.StateUnknown, list[0].State)
	require.Equal(t, idempotency.StoredKey("pay-1"), list[0].StoredKey)

	decision := idempotency.Decision{By: "ana", Note: "the provider's dashboard shows the charge"}
	require.NoError(t, h.edge.Resolve(ctx, h.db.Pool, idempotency.Ref{Tenant: "acme", Operation: "create-payment", StoredKey: list[0].StoredKey},
		idempotency.Resolution{State: idempotency.StateCompleted, Response: idempotency.StoredResponse{
			StatusCode: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"resolved":true}`)}},
		decision))
	require.NoError(t, h.edge.Resolve(ctx, h.db.Pool, idempotency.Ref{Tenant: "acme", Operation: "create-payment", Key: "pay-2"},
		idempotency.Resolution{State: idempotency.StateReleased}, idempotency.Decision{By: "ana", Note: "never charged"}))

	replay := h.post(t, "acme", "pay-1", `{"amount":100}`)
	require.Equal(t, http.StatusCreated, replay.status)
	require.JSONEq(t, `{"resolved":true}`, replay.body)
	require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-2", `{"amount":100}`).status, "released: the retry runs")
	require.EqualValues(t, 3, h.runs.Load())
	require.Equal(t, 2, count(t, h.db, `SELECT count(*) FROM idempotency_keys
		WHERE resolved_by = 'ana' AND resolution_note <> '' AND resolved_at IS NOT NULL`), "the decisions are recorded")

	err = h.edge.Resolve(ctx, h.db.Pool, idempotency.Ref{Tenant: "acme", Operation: "create-payment", Key: "pay-1"},
		idempotency.Resolution{State: idempotency.StateReleased}, decision)
	require.ErrorIs(t, err, idempotency.ErrNotResolvable)
	err = h.edge.Resolve(ctx, h.db.Pool, idempotency.Ref{Tenant: "acme", Operation: "create-payment", Key: "nope"},
		idempotency.Resolution{State: idempotency.StateReleased}, decision)
	require.ErrorIs(t, err, idempotency.ErrRecordNotFound)
	err = h.edge.Resolve(ctx, h.db.Pool, idempotency.Ref{Tenant: "acme", Operation: "create-payment", Key: "pay-1"},
		idempotency.Resolution{State: idempotency.StateReleased}, idempotency.Decision{By: "ana"})
	require.Error(t, err, "a decision without a reason is refused")
	require.False(t, errors.Is(err, idempotency.ErrNotResolvable))
}

// getStatus reads the status resource as tenant.
func getStatus(t *testing.T, url, tenant string) idempotency.Status {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var st idempotency.Status
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st
}

func getStatusCode(t *testing.T, url, tenant string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// An unknown's reason comes from outside (a provider's error text): NUL,
// invalid UTF-8 and length are made storable, and the record is kept.
func TestUnknownReasonIsMadeStorable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{}, nil)
	h.provider = newFakeProvider(t)
	h.provider.srv.Close() // every charge fails: its error text becomes the reason
	mw, err := h.edge.Route(&idempotency.Route{Operation: "hostile", Tenant: tenantFromHeader})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, idempotency.Unknown(r, "charge: \x00\xff\xfe "+strings.Repeat("é", 3000)))
	})))
	t.Cleanup(srv.Close)
	p := post(t, srv.URL, "acme", "k-1", `{}`)
	require.Equal(t, idempotency.CodeOutcomeUnknown, p.problemCode(t))
	var reason string
	require.NoError(t, h.db.Pool.QueryRow(context.Background(), `SELECT unknown_reason FROM idempotency_keys WHERE operation = 'hostile'`).Scan(&reason))
	require.True(t, utf8.ValidString(reason))
	require.NotContains(t, reason, "\x00")
	require.LessOrEqual(t, len(reason), 1024+8)
	require.ErrorIs(t, idempotency.Unknown(httptest.NewRequest(http.MethodGet, "/", nil), "x"), idempotency.ErrNotInRoute)
}
