package idempotency_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// answer is what the fundsRoute handler answers next.
type answer struct {
	status      int
	code        string // the problem's "code"; "" for a success
	contentType string // defaults to application/problem+json for a problem
	raw         string // the whole body, when set
}

// fundsRoute is a route over the harness's edge whose handler answers what
// next holds, counting its runs; a success spends the request's amount
// from balance, an amount over it answers 402 INSUFFICIENT_FUNDS.
type fundsRoute struct {
	srv     *httptest.Server
	runs    atomic.Int64
	balance atomic.Int64
	next    atomic.Pointer[answer]
}

func newFundsRoute(t *testing.T, h *harness, route idempotency.Route) *fundsRoute {
	t.Helper()
	s := &fundsRoute{}
	route.Operation, route.Tenant = "create-payment", tenantFromHeader
	mw, err := h.edge.Route(&route)
	require.NoError(t, err)
	s.srv = httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		var in struct {
			Amount int64 `json:"amount"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		a := s.next.Load()
		if a == nil && in.Amount > s.balance.Load() {
			a = &answer{status: http.StatusPaymentRequired, code: "INSUFFICIENT_FUNDS"}
		}
		if a == nil {
			s.balance.Add(-in.Amount)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, `{"paid":%d,"run":%d}`, in.Amount, s.runs.Load())
			return
		}
		w.Header().Set("Content-Type", cmpOr(a.contentType, "application/problem+json"))
		w.WriteHeader(a.status)
		if a.raw != "" {
			_, _ = fmt.Fprint(w, a.raw)
			return
		}
		b, _ := json.Marshal(map[string]any{"type": "about:blank", "status": a.status, "code": a.code, "run": s.runs.Load()})
		_, _ = w.Write(b)
	})))
	t.Cleanup(s.srv.Close)
	return s
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (s *fundsRoute) post(t *testing.T, key, body string) response {
	t.Helper()
	return post(t, s.srv.URL, "acme", key, body)
}

// A rejection that depends on state (402 INSUFFICIENT_FUNDS) is binding by
// default: stored, and replayed after the balance changed. A route that
// says the code is Released stores nothing for it: the same key and body
// run again once the balance allows, and succeed; the success is then
// replayed, and another body under the key is still refused.
func TestStateDependentRejectionIsBindingOrReleased(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, released := range []bool{false, true} {
			name := mode.String() + "/binding"
			route := idempotency.Route{Mode: mode}
			if released {
				name = mode.String() + "/released"
				route.Responses = &idempotency.Responses{Rejections: map[string]idempotency.Rejection{"INSUFFICIENT_FUNDS": idempotency.Released}}
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, idempotency.Route{Mode: mode}, nil)
				s := newFundsRoute(t, h, route)
				s.balance.Store(50)

				first := s.post(t, "pay-1", `{"amount":100}`)
				require.Equal(t, http.StatusPaymentRequired, first.status, first.body)
				require.Equal(t, "INSUFFICIENT_FUNDS", first.problemCode(t))
				s.balance.Store(500) // the account was topped up

				retry := s.post(t, "pay-1", `{"amount":100}`)
				if !released {
					require.Equal(t, http.StatusPaymentRequired, retry.status, "a binding rejection is replayed after the state changed")
					require.Equal(t, "true", retry.header.Get(idempotency.HeaderReplayed))
					require.Equal(t, first.body, retry.body)
					require.EqualValues(t, 1, s.runs.Load())
					require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'completed' AND status_code = 402`))
					return
				}
				require.Equal(t, http.StatusCreated, retry.status, "a released rejection runs again under the same key: %s", retry.body)
				require.Empty(t, retry.header.Get(idempotency.HeaderReplayed))
				require.EqualValues(t, 2, s.runs.Load())
				require.EqualValues(t, 400, s.balance.Load(), "paid once")
				again := s.post(t, "pay-1", `{"amount":100}`)
				require.Equal(t, http.StatusCreated, again.status)
				require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed), "the success is binding")
				require.Equal(t, retry.body, again.body)
				require.EqualValues(t, 2, s.runs.Load())
				require.Equal(t, idempotency.CodeKeyReused, s.post(t, "pay-1", `{"amount":1}`).problemCode(t))
			})
		}
	}
}

// A released code is released until it runs under another answer, and
// stays refused for another body meanwhile; codes the route does not list,
// a code that is malformed (too long, with NUL or control characters, not
// a string) and a body that is not JSON are binding.
func TestOnlyTheListedCodesAreReleased(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			s := newFundsRoute(t, h, idempotency.Route{Mode: mode, Responses: &idempotency.Responses{
				Rejections: map[string]idempotency.Rejection{"INSUFFICIENT_FUNDS": idempotency.Released, "CARD_DECLINED": idempotency.Binding}}})
			s.balance.Store(0)
			require.Equal(t, http.StatusPaymentRequired, s.post(t, "released", `{"amount":100}`).status)
			require.Equal(t, idempotency.CodeKeyReused, s.post(t, "released", `{"amount":7}`).problemCode(t), "released keeps its request's fingerprint")
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'released'`))

			binding := []answer{
				{status: http.StatusPaymentRequired, code: "CARD_DECLINED"},
				{status: http.StatusUnprocessableEntity, code: "UNLISTED"},
				{status: http.StatusPaymentRequired, raw: `{"code":"INSUFFICIENT_FUNDS\u0000"}`},
				{status: http.StatusPaymentRequired, raw: `{"code":"INSUFFICIENT_FUNDS\u0007"}`},
				{status: http.StatusPaymentRequired, raw: `{"code":"INSUFFICIENT_FUNDS` + strings.Repeat("X", 100) + `"}`},
				{status: http.StatusPaymentRequired, raw: "{\"code\":\"INSUFFICIENT_FUNDS\xff\"}"},
				{status: http.StatusPaymentRequired, raw: `{"code":42,"errorCode":"INSUFFICIENT_FUNDS"}`},
				{status: http.StatusPaymentRequired, raw: `INSUFFICIENT_FUNDS`, contentType: "text/plain"},
				{status: http.StatusPaymentRequired, raw: `{"code":`},
			}
			for i, a := range binding {
				s.next.Store(&a)
				key := fmt.Sprintf("binding-%d", i)
				require.Equal(t, a.status, s.post(t, key, `{"amount":1}`).status)
				s.next.Store(nil)
				s.balance.Store(1000)
				retry := s.post(t, key, `{"amount":1}`)
				require.Equal(t, a.status, retry.status, "%+v", a)
				require.Equal(t, "true", retry.header.Get(idempotency.HeaderReplayed), "%+v is binding", a)
				s.balance.Store(0)
			}
			s.next.Store(&answer{status: http.StatusPaymentRequired, raw: `{"errorCode":"INSUFFICIENT_FUNDS"}`, contentType: "application/json"})
			require.Equal(t, http.StatusPaymentRequired, s.post(t, "errorcode", `{"amount":1}`).status)
			s.next.Store(nil)
			s.balance.Store(1000)
			require.Equal(t, http.StatusCreated, s.post(t, "errorcode", `{"amount":1}`).status, `"errorCode" names the code too`)
		})
	}
}

// With a custom Route.Responses.Store, Rejections applies to what Store stores:
// Store's refusal releases whatever the code says (a 409 a route treats as
// transient), a status Store keeps that DefaultStore would not (429) is
// replayed, and a Released code is released.
func TestRejectionsApplyOnTopOfACustomStore(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{}, nil)
	s := newFundsRoute(t, h, idempotency.Route{Responses: &idempotency.Responses{
		Store: func(status int) bool { return status < 500 && status != http.StatusConflict },
		Rejections: map[string]idempotency.Rejection{
			"ACCOUNT_BUSY": idempotency.Binding, "INSUFFICIENT_FUNDS": idempotency.Released},
	}})
	for _, c := range []struct {
		key    string
		answer answer
		replay bool
	}{
		{"busy", answer{status: http.StatusConflict, code: "ACCOUNT_BUSY"}, false},
		{"velocity", answer{status: http.StatusTooManyRequests, code: "VELOCITY_LIMIT"}, true},
		{"funds", answer{status: http.StatusPaymentRequired, code: "INSUFFICIENT_FUNDS"}, false},
	} {
		s.next.Store(&c.answer)
		require.Equal(t, c.answer.status, s.post(t, c.key, `{"amount":1}`).status)
		s.next.Store(nil)
		s.balance.Store(10)
		retry := s.post(t, c.key, `{"amount":1}`)
		if c.replay {
			require.Equal(t, c.answer.status, retry.status, c.key)
			require.Equal(t, "true", retry.header.Get(idempotency.HeaderReplayed), c.key)
			continue
		}
		require.Equal(t, http.StatusCreated, retry.status, c.key)
	}
}

// Route.Responses.Rejections' codes are checked when the route is made: empty, too
// long, with NUL, control characters, spaces or invalid UTF-8, or an
// unknown Rejection, is a configuration error naming the field.
func TestRejectionsRefusesMalformedCodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{}, nil)
	for _, m := range []map[string]idempotency.Rejection{
		{"": idempotency.Released},
		{strings.Repeat("A", idempotency.MaxProblemCodeLen+1): idempotency.Released},
		{"A\x00B": idempotency.Released},
		{"A\nB": idempotency.Released},
		{"A B": idempotency.Released},
		{"A\xffB": idempotency.Released},
		{"OK": idempotency.Rejection(7)},
	} {
		_, err := h.edge.Route(&idempotency.Route{Operation: "create-payment", Tenant: tenantFromHeader, Responses: &idempotency.Responses{Rejections: m}})
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig, "%q", m)
		require.ErrorContains(t, err, "Route.Responses.Rejections")
	}
	_, err := h.edge.Route(&idempotency.Route{Operation: "create-payment", Tenant: tenantFromHeader,
		Responses: &idempotency.Responses{Rejections: map[string]idempotency.Rejection{strings.Repeat("A", idempotency.MaxProblemCodeLen): idempotency.Released, "a.b:c-d_e": idempotency.Binding}}})
	require.NoError(t, err)
}
