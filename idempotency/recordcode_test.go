package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/idempotency"
)

// A record keeps its answer's problem code and its operation's ID past the
// body's lifetime, and on a route that stores no body: the status resource
// and Records show them for a binding rejection, a released one and a
// success, after Prune emptied the bodies; from the operation's ID (a
// payment's) Records finds the key's record. A released key that runs
// again and succeeds loses the rejection's code.
func TestProblemCodeAndOperationIDOutliveTheBody(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		for _, noBody := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/NoStoreBody=%v", mode, noBody), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				h := newHarness(t, idempotency.Route{Mode: mode}, nil)
				s := newFundsRoute(t, h, idempotency.Route{Mode: mode, Responses: &idempotency.Responses{NoStoreBody: noBody,
					Rejections: map[string]idempotency.Rejection{"LIMIT_REACHED": idempotency.Released}}})
				require.Equal(t, http.StatusPaymentRequired, s.post(t, "pay-1", `{"amount":100}`).status)
				s.next.Store(&answer{status: http.StatusUnprocessableEntity, code: "LIMIT_REACHED"})
				require.Equal(t, http.StatusUnprocessableEntity, s.post(t, "pay-2", `{"amount":1}`).status)
				s.next.Store(nil)
				s.balance.Store(1000)
				require.Equal(t, http.StatusCreated, s.post(t, "pay-3", `{"amount":1}`).status)

				_, err := h.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET body_expires_at = now() - interval '1 second'
					WHERE body_expires_at IS NOT NULL`)
				require.NoError(t, err)
				_, err = h.edge.Prune(ctx)
				require.NoError(t, err)
				require.Zero(t, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE response_body IS NOT NULL`), "the bodies are gone")

				records, err := idempotency.NewRecords(h.db.Schema)
				require.NoError(t, err)
				for key, want := range map[string]struct {
					state  idempotency.State
					status int
					code   string
				}{
					"pay-1": {idempotency.StateCompleted, http.StatusPaymentRequired, "INSUFFICIENT_FUNDS"},
					"pay-2": {idempotency.StateReleased, 0, "LIMIT_REACHED"},
					"pay-3": {idempotency.StateCompleted, http.StatusCreated, ""},
				} {
					opID := oncekit.DeriveID("acme", key)
					st := getStatus(t, h.srv.URL+"/idempotency/"+idempotency.StoredKey(key), "acme")
					require.Equal(t, want.state, st.State, key)
					require.Equal(t, want.status, st.StatusCode, key)
					require.Equal(t, want.code, st.Code, key)
					require.Equal(t, opID.String(), st.OperationID, key)

					refs, err := records.ByOperationID(ctx, h.db.Pool, opID, 10)
					require.NoError(t, err)
					require.Equal(t, []idempotency.Ref{{Tenant: "acme", Operation: "create-payment", StoredKey: idempotency.StoredKey(key)}}, refs, key)
					rec, err := records.Get(ctx, h.db.Pool, refs[0])
					require.NoError(t, err)
					require.Equal(t, want.code, rec.ProblemCode, key)
					require.Equal(t, opID, rec.OperationID, key)
				}
				refs, err := records.ByOperationID(ctx, h.db.Pool, oncekit.DeriveID("globex", "pay-1"), 10)
				require.NoError(t, err)
				require.Empty(t, refs, "another scope's operation")

				require.Equal(t, http.StatusCreated, s.post(t, "pay-2", `{"amount":1}`).status, "released: runs again")
				st := getStatus(t, h.srv.URL+"/idempotency/"+idempotency.StoredKey("pay-2"), "acme")
				require.Equal(t, idempotency.StateCompleted, st.State)
				require.Empty(t, st.Code, "the success's record has no problem code")
			})
		}
	}
}

// A problem code that is malformed (NUL, control characters, invalid
// UTF-8, over MaxProblemCodeLen, not a string, missing) or a body that is
// not JSON keeps no code on the record: the answer is stored as it is, its
// code column stays NULL.
func TestMalformedProblemCodesAreNotKept(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, nil)
			s := newFundsRoute(t, h, idempotency.Route{Mode: mode, Responses: &idempotency.Responses{NoStoreBody: true}})
			for i, raw := range []string{
				`{"code":"BAD\u0000CODE"}`, `{"code":"BAD\u0007CODE"}`, "{\"code\":\"BAD\xffCODE\"}",
				`{"code":"` + strings.Repeat("A", idempotency.MaxProblemCodeLen+1) + `"}`,
				`{"code":"TWO WORDS"}`, `{"code":""}`, `{"code":42}`, `{"code":null}`, `{}`, `not json`,
			} {
				s.next.Store(&answer{status: http.StatusUnprocessableEntity, raw: raw})
				require.Equal(t, http.StatusUnprocessableEntity, s.post(t, fmt.Sprintf("bad-%d", i), `{"amount":1}`).status, raw)
			}
			s.next.Store(&answer{status: http.StatusUnprocessableEntity, code: strings.Repeat("A", idempotency.MaxProblemCodeLen)})
			require.Equal(t, http.StatusUnprocessableEntity, s.post(t, "longest", `{"amount":1}`).status)
			require.Equal(t, 11, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE state = 'completed' AND status_code = 422`))
			require.Equal(t, 1, count(t, h.db, `SELECT count(*) FROM idempotency_keys WHERE problem_code IS NOT NULL`), "only the valid code is kept")
		})
	}
}
