package sideeffect_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

var batches atomic.Int64

type bundle struct {
	db     *testenv.DB
	ledger *sideeffect.Ledger
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db := testenv.NewDB(t)
	l, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	return &bundle{db: db, ledger: l}
}

// record records n effects of kind in one transaction and returns their keys.
func (b *bundle) record(t testing.TB, kind string, n int) []string {
	t.Helper()
	return b.recordIn(t, context.Background(), kind, n)
}

// recordIn is record in ctx (its trace context, say).
func (b *bundle) recordIn(t testing.TB, ctx context.Context, kind string, n int) []string {
	t.Helper()
	keys := make([]string, 0, n)
	batch := batches.Add(1)
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		for i := range n {
			r, err := b.ledger.Record(ctx, tx, sideeffect.Effect{
				SourceID: fmt.Sprintf("src-%s-%d-%d", kind, batch, i), Kind: kind, Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			})
			if err != nil {
				return err
			}
			keys = append(keys, r.Key)
		}
		return nil
	}))
	return keys
}

// fastConfig is a dispatcher configuration with short intervals for tests.
func fastConfig(b *bundle) *sideeffect.DispatcherConfig {
	return &sideeffect.DispatcherConfig{
		PollInterval:    20 * time.Millisecond,
		RecoverInterval: 50 * time.Millisecond,
		MinBackoff:      10 * time.Millisecond,
		MaxBackoff:      50 * time.Millisecond,
		CallTimeout:     5 * time.Second,
		Lease:           10 * time.Second,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// start runs a dispatcher until the test ends (or stop is called).
func start(t testing.TB, b *bundle, providers map[string]sideeffect.Provider, cfg *sideeffect.DispatcherConfig) (stop func()) {
	t.Helper()
	d, err := sideeffect.NewDispatcher(b.db.Pool, b.ledger, providers, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		require.NoError(t, d.Run(ctx))
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func hook(rc *receiver, cfg *webhook.Config) sideeffect.Provider {
	if cfg == nil {
		cfg = &webhook.Config{}
	}
	cfg.URL, cfg.Secret = rc.URL, testSecret
	p, err := webhook.New(cfg)
	if err != nil {
		panic(err)
	}
	return p
}

// countState counts effects in a state.
func (b *bundle) countState(t testing.TB, st sideeffect.State) int {
	t.Helper()
	var n int
	assert.NoError(t, b.db.Pool.QueryRow(context.Background(), // t.Errorf: safe in Eventually conditions
		`SELECT count(*) FROM side_effects WHERE state = $1`, string(st)).Scan(&n))
	return n
}

// waitState waits until n effects are in state st.
func (b *bundle) waitState(t testing.TB, st sideeffect.State, n int, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return b.countState(t, st) == n }, within, 10*time.Millisecond,
		"waiting for %d effects %s", n, st)
}

func (b *bundle) rowByKey(t testing.TB, key string) sideeffect.Row {
	t.Helper()
	var id int64
	if !assert.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT id FROM side_effects WHERE idempotency_key = $1`, key).Scan(&id)) {
		return sideeffect.Row{}
	}
	r, err := b.ledger.Get(context.Background(), b.db.Pool, id)
	assert.NoError(t, err) // t.Errorf: safe in Eventually conditions
	return r
}

// metric reads one labelled sample from a registry.
func metric(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	var pairs []string
	for k, v := range labels {
		pairs = append(pairs, k, v)
	}
	return testenv.Metric(t, reg, name, pairs...)
}
