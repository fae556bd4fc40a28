package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// A response stored before a deploy that changed the response's shape
// (ResponseVersions.Current 1 → 2) is replayed as stored without a hook, upgraded by
// ResponseVersions.Upgrade, or refused with IDEMPOTENCY_RESPONSE_OUTDATED.
func TestReplayAcrossResponseVersions(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			v1 := newHarness(t, idempotency.Route{Mode: mode, ResponseVersions: &idempotency.ResponseVersions{Current: 1}}, nil)
			first := v1.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, first.status)
			require.Equal(t, 1, count(t, v1.db, `SELECT count(*) FROM idempotency_keys WHERE response_version = 1`))

			asStored := newHarnessOn(t, v1.db, idempotency.Route{Mode: mode, ResponseVersions: &idempotency.ResponseVersions{Current: 2}}, nil)
			require.Equal(t, first.body, asStored.post(t, "acme", "pay-1", `{"amount":100}`).body)

			upgraded := newHarnessOn(t, v1.db, idempotency.Route{Mode: mode, ResponseVersions: &idempotency.ResponseVersions{Current: 2,
				Upgrade: func(resp *idempotency.StoredResponse, from int) error {
					if from != 1 {
						return errors.New("unknown version")
					}
					var v map[string]any
					if err := json.Unmarshal(resp.Body, &v); err != nil {
						return err
					}
					v["amount_minor"] = v["amount"] // v2 renamed amount
					delete(v, "amount")
					var err error
					resp.Body, err = json.Marshal(v)
					resp.Header.Set("Api-Version", "2")
					return err
				}}}, nil)
			up := upgraded.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, up.status)
			require.Contains(t, up.body, `"amount_minor":100`)
			require.NotContains(t, up.body, `"amount":`)
			require.Equal(t, "2", up.header.Get("Api-Version"))

			reg := prometheus.NewRegistry()
			refused := newHarnessOn(t, v1.db, idempotency.Route{Mode: mode, ResponseVersions: &idempotency.ResponseVersions{Current: 2,
				Upgrade: func(*idempotency.StoredResponse, int) error { return errors.New("v1 is retired") }}},
				&idempotency.Config{Registerer: reg})
			out := refused.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, idempotency.CodeResponseOutdated, out.problemCode(t))
			require.Equal(t, first.header.Get("Location"), out.instance(t), "the resource is linked")
			require.InDelta(t, 1, outcomeCount(t, reg, idempotency.OutcomeOutdated), 0)
			require.Zero(t, asStored.runs.Load()+upgraded.runs.Load()+refused.runs.Load(), "no replay ran the handler")
		})
	}
}

// A route that fingerprints its validated command treats two spellings of
// one command (an unknown field, a default written out) as one request,
// and a different command as a reuse; a command it refuses answers 400.
func TestCommandFingerprint(t *testing.T) {
	t.Parallel()
	command := func(_ *http.Request, body []byte) ([]byte, error) {
		var in struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		if err := dec.Decode(&in); err != nil {
			return nil, err
		}
		if in.Amount <= 0 {
			return nil, errors.New("amount must be positive")
		}
		if in.Currency == "" {
			in.Currency = "EUR" // the default
		}
		return json.Marshal(struct {
			API      int    `json:"api"`
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}{1, in.Amount, in.Currency})
	}
	h := newHarness(t, idempotency.Route{Command: command}, nil)
	require.Equal(t, http.StatusCreated, h.post(t, "acme", "pay-1", `{"amount":100}`).status)
	same := h.post(t, "acme", "pay-1", `{"currency":"EUR","amount":100,"client_note":"retry"}`)
	require.Equal(t, http.StatusCreated, same.status, same.body)
	require.Equal(t, "true", same.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, idempotency.CodeKeyReused, h.post(t, "acme", "pay-1", `{"amount":100,"currency":"USD"}`).problemCode(t))
	bad := h.post(t, "acme", "pay-2", `{"amount":-1}`)
	require.Equal(t, idempotency.CodeBodyInvalid, bad.problemCode(t))
	require.Contains(t, bad.body, "amount must be positive")
	require.EqualValues(t, 1, h.runs.Load())

	raw := newHarnessOn(t, h.db, idempotency.Route{Operation: "raw"}, nil)
	require.Equal(t, http.StatusCreated, raw.post(t, "acme", "pay-1", `{"amount":100}`).status)
	require.Equal(t, idempotency.CodeKeyReused, raw.post(t, "acme", "pay-1", `{"amount":100,"currency":"EUR"}`).problemCode(t),
		"without Command, the raw body is the request")
}
