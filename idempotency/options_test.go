package idempotency_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency"
)

// gcmSealer is an AES-GCM Sealer, as a user would write one.
type gcmSealer struct{ aead cipher.AEAD }

func newGCMSealer(t *testing.T) *gcmSealer {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	block, err := aes.NewCipher(key)
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	return &gcmSealer{aead: aead}
}

func (s *gcmSealer) Seal(plain, aad []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, plain, aad), nil
}

func (s *gcmSealer) Open(sealed, aad []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("short ciphertext")
	}
	return s.aead.Open(nil, sealed[:n], sealed[n:], aad)
}

// With a Sealer the stored body is ciphertext bound to its record; replays
// decrypt it.
func TestSealedBodies(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, idempotency.Route{Mode: mode}, &idempotency.Config{Sealer: newGCMSealer(t)})
			first := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, http.StatusCreated, first.status)
			var stored []byte
			var sealed bool
			require.NoError(t, h.db.Pool.QueryRow(context.Background(),
				`SELECT response_body, body_sealed FROM idempotency_keys`).Scan(&stored, &sealed))
			require.True(t, sealed)
			require.False(t, bytes.Contains(stored, []byte(`"amount":100`)), "body stored in clear")
			again := h.post(t, "acme", "pay-1", `{"amount":100}`)
			require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
			require.Equal(t, first.body, again.body)

			// A sealed body moved to another record does not open there.
			_, err := h.db.Pool.Exec(context.Background(), `UPDATE idempotency_keys SET key = $1`, idempotency.StoredKey("pay-2"))
			require.NoError(t, err)
			moved := h.post(t, "acme", "pay-2", `{"amount":100}`)
			require.Equal(t, http.StatusServiceUnavailable, moved.status)
		})
	}
}

// Responses.NoStoreBody keeps status and headers only; a replay has an empty body.
func TestNoStoreBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t, idempotency.Route{Responses: &idempotency.Responses{NoStoreBody: true}}, nil)
	first := h.post(t, "acme", "pay-1", `{"amount":100}`)
	require.Equal(t, http.StatusCreated, first.status)
	require.NotEmpty(t, first.body)
	require.Equal(t, 0, count(t, h.db, `SELECT length(response_body) FROM idempotency_keys`))
	again := h.post(t, "acme", "pay-1", `{"amount":100}`)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	require.Empty(t, again.body)
	require.EqualValues(t, 1, h.runs.Load())
}

// Every outcome is counted under its bounded label.
func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h := newHarness(t, idempotency.Route{}, &idempotency.Config{Registerer: reg})
	h.post(t, "acme", "", `{"amount":1}`)
	h.post(t, "acme", `""`, `{"amount":1}`)
	h.post(t, "acme", "k", `{"amount":1}`)
	h.post(t, "acme", "k", `{"amount":1}`)
	h.post(t, "acme", "k", `{"amount":2}`)
	release := h.withGate()
	done := make(chan response, 1)
	go func() { done <- postInBackground(t, h.srv.URL+"/payments", "acme", "slow", `{"amount":1}`) }()
	<-h.inside
	h.post(t, "acme", "slow", `{"amount":1}`)
	release()
	<-done

	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					name += "/" + l.GetValue()
				}
			}
			got[name] += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	require.Equal(t, map[string]float64{
		"oncekit_idempotency_requests_total/missing_key":          1,
		"oncekit_idempotency_requests_total/invalid_key":          1,
		"oncekit_idempotency_key_quality_total":                   2, // "k" and "slow": short
		"oncekit_idempotency_requests_total/new":                  2,
		"oncekit_idempotency_requests_total/replayed":             1,
		"oncekit_idempotency_requests_total/mismatch":             1,
		"oncekit_idempotency_requests_total/conflict_in_progress": 1,
		"oncekit_idempotency_records_stored_total":                2,
		"oncekit_idempotency_in_progress_age_seconds":             1,
	}, filterNonZero(got))

	_, err = idempotency.New(h.db.Pool, &idempotency.Config{Schema: h.db.Schema, Registerer: reg})
	require.ErrorContains(t, err, "Config.Registerer")
}

func filterNonZero(m map[string]float64) map[string]float64 {
	for k, v := range m {
		if v == 0 {
			delete(m, k)
		}
	}
	return m
}
