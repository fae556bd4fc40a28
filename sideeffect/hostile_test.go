package sideeffect_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// calls counts provider calls by payload.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(p []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[string(p)]++
	return c.n[string(p)]
}

func (c *calls) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// requireEachOnce requires n payloads, each called exactly once.
func (c *calls) requireEachOnce(t *testing.T, n int) {
	t.Helper()
	got := c.snapshot()
	require.Len(t, got, n)
	for payload, k := range got {
		require.Equal(t, 1, k, payload)
	}
}

// stateOf reads an effect's state and texts by its payload's n.
func (b *bundle) stateOf(t *testing.T, n int) (state, ref, lastErr string) {
	t.Helper()
	p, _ := json.Marshal(map[string]int{"n": n})
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT state, coalesce(provider_ref, ''), coalesce(last_error, '') FROM side_effects WHERE payload = $1`, p).
		Scan(&state, &ref, &lastErr))
	return state, ref, lastErr
}

// A provider's answers that text columns refuse as they are (a reference
// with a NUL, an error cut in the middle of a character, an error that is
// not UTF-8) are stored made readable, and every effect of the round gets
// its outcome: each is called once (the indefinite one up to MaxAttempts).
// Before, PostgreSQL refused the round's one UPDATE, every outcome in it was
// lost, and the effects were called again at each lease's expiry.
func TestHostileProviderAnswersSettleEachEffectOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var c calls
	p := sideeffect.ProviderFunc(func(ctx context.Context, call sideeffect.Call) (string, error) {
		c.add(call.Payload)
		var v struct{ N int }
		_ = json.Unmarshal(call.Payload, &v)
		switch v.N {
		case 0:
			return "ref-\x00-\xff", nil
		case 1:
			return "", sideeffect.Definite(errors.New(strings.Repeat("é", 1500)))
		case 2:
			return "", errors.New("upstream said \xff\xfe")
		}
		return "ok", nil
	})
	cfg := fastConfig(b)
	cfg.MaxAttempts = 2
	b.record(t, "k", 5)
	start(t, b, map[string]sideeffect.Provider{"k": p}, cfg)
	b.waitState(t, sideeffect.StateConfirmed, 3, 20*time.Second)
	b.waitState(t, sideeffect.StateFailed, 1, 20*time.Second)
	b.waitState(t, sideeffect.StateUnknown, 1, 20*time.Second)

	got := c.snapshot()
	require.Equal(t, map[string]int{`{"n":0}`: 1, `{"n":1}`: 1, `{"n":2}`: 2, `{"n":3}`: 1, `{"n":4}`: 1}, got)
	_, ref, _ := b.stateOf(t, 0)
	require.Equal(t, "ref-\uFFFD-\uFFFD", ref)
	_, _, lastErr := b.stateOf(t, 1)
	require.True(t, utf8.ValidString(lastErr))
	require.LessOrEqual(t, len(lastErr), 2000)
	_, _, lastErr = b.stateOf(t, 2)
	require.Contains(t, lastErr, "upstream said \uFFFD\uFFFD")
}

// An outcome PostgreSQL refuses whatever its text (here CHECK constraints
// an operator added) is settled alone: committed without the provider's
// text or, if that is refused too, as unknown for an operator. The other
// outcomes of its round commit, and nothing is called twice.
func TestRefusedOutcomeSettledAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.db.Pool.Exec(context.Background(), `ALTER TABLE side_effects
		ADD CONSTRAINT refuse_ref CHECK (provider_ref IS DISTINCT FROM 'refuse-me'),
		ADD CONSTRAINT refuse_failed CHECK (state <> 'failed' OR payload <> convert_to('{"n":1}', 'UTF8'))`)
	require.NoError(t, err)
	var c calls
	p := sideeffect.ProviderFunc(func(ctx context.Context, call sideeffect.Call) (string, error) {
		c.add(call.Payload)
		switch string(call.Payload) {
		case `{"n":0}`:
			return "refuse-me", nil
		case `{"n":1}`:
			return "", sideeffect.Definite(errors.New("declined"))
		}
		return "ok", nil
	})
	b.record(t, "k", 6)
	start(t, b, map[string]sideeffect.Provider{"k": p}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, 5, 20*time.Second)
	b.waitState(t, sideeffect.StateUnknown, 1, 20*time.Second)
	c.requireEachOnce(t, 6)
	state, ref, lastErr := b.stateOf(t, 0)
	require.Equal(t, "confirmed", state)
	require.Empty(t, ref)
	require.Contains(t, lastErr, "refused by PostgreSQL")
	state, _, lastErr = b.stateOf(t, 1)
	require.Equal(t, "unknown", state)
	require.Contains(t, lastErr, "could not be recorded")
}

// An ordinary error page in a legacy encoding, longer than the webhook keeps
// of it, fails its effect once (a definite 4xx) and the effects beside it
// confirm once.
func TestWebhookLatin1ErrorPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var c calls
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c.add(body)
		if string(body) == `{"n":0}` {
			w.Header().Set("Content-Type", "text/html; charset=iso-8859-1")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte(strings.Repeat("Requ\xeate refus\xe9e ", 40)))
			return
		}
		w.Header().Set("Webhook-Ref", "r\xe9f")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	hp, err := webhook.New(&webhook.Config{URL: srv.URL, Secret: testSecret})
	require.NoError(t, err)
	b.record(t, "hook", 5)
	start(t, b, map[string]sideeffect.Provider{"hook": hp}, fastConfig(b))
	b.waitState(t, sideeffect.StateConfirmed, 4, 20*time.Second)
	b.waitState(t, sideeffect.StateFailed, 1, 20*time.Second)
	c.requireEachOnce(t, 5)
	_, _, lastErr := b.stateOf(t, 0)
	require.Contains(t, lastErr, "Requ\uFFFDte")
}
