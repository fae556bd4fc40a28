package main

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

func runDispatch(ctx context.Context, cfg *config, pool *pgxpool.Pool) error {
	if cfg.Broken == brokenCallBeforeFired {
		providers, err := newProviders(cfg)
		if err != nil {
			return err
		}
		return (&callInTx{pool: pool, table: cfg.table("side_effects"), providers: providers, workers: 16}).Run(ctx)
	}
	d, err := newDispatcher(pool, cfg, slog.Default())
	if err != nil {
		return err
	}
	return ignoreCancel(d.Run(ctx))
}

// newDispatcher fires both kinds of effect at the provider, each call with
// the effect's derived key. A dispatcher that dies mid-call leaves a fired
// row; when its lease expires another retries it with the same key, which
// the provider honours.
func newDispatcher(pool *pgxpool.Pool, cfg *config, log *slog.Logger) (*sideeffect.Dispatcher, error) {
	providers, err := newProviders(cfg)
	if err != nil {
		return nil, err
	}
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: cfg.Schema})
	if err != nil {
		return nil, err
	}
	return sideeffect.NewDispatcher(pool, ledger, providers, &sideeffect.DispatcherConfig{
		Concurrency:     16,
		PollInterval:    50 * time.Millisecond,
		CallTimeout:     2 * time.Second,
		Lease:           cfg.Lease,
		RecoverInterval: time.Second,
		MinBackoff:      100 * time.Millisecond,
		MaxBackoff:      2 * time.Second,
		Logger:          log,
	})
}

// newProviders returns the provider's two endpoints by effect kind.
func newProviders(cfg *config) (map[string]sideeffect.Provider, error) {
	base := strings.TrimRight(cfg.ProviderURL, "/")
	providers := map[string]sideeffect.Provider{}
	for kind, path := range map[string]string{kindCapture: "/capture", kindReceipt: "/email"} {
		p, err := webhook.New(&webhook.Config{URL: base + path, Timeout: 2 * time.Second, Unsigned: true}) // the fake provider checks no signature
		if err != nil {
			return nil, err
		}
		providers[kind] = p
		if cfg.Broken == brokenFreshKey {
			providers[kind] = freshKey{p}
		}
	}
	return providers, nil
}
