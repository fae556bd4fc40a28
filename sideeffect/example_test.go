package sideeffect_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// A handler records the effect in its own transaction; the dispatcher (in
// this process or in `oncekit dispatch`) fires it later with the derived key.
func ExampleLedger_Record() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: "oncekit"})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the handler's own writes ...
		rec, err := ledger.Record(ctx, tx, sideeffect.Effect{
			SourceID: "pay_123", Kind: "email.receipt", Payload: []byte(`{"to":"ana@example.com"}`),
		})
		if err != nil {
			return err
		}
		log.Printf("effect %d key %s (already recorded: %v)", rec.ID, rec.Key, rec.Existing)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// The dispatcher runs until SIGTERM, with a webhook endpoint for one kind and
// the application's own provider for another.
func ExampleNewDispatcher() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	hook, err := webhook.New(&webhook.Config{URL: "https://hooks.example.com/orders", Secret: os.Getenv("WEBHOOK_SECRET")})
	if err != nil {
		log.Fatal(err)
	}
	email := sideeffect.ProviderFunc(func(ctx context.Context, c sideeffect.Call) (string, error) {
		// Pass c.Key to the email API as its idempotency key.
		return "msg-id-from-the-api", nil
	})
	ledger, err := sideeffect.New(nil) // the recorders' ledger: the dispatcher takes its schema
	if err != nil {
		log.Fatal(err)
	}
	d, err := sideeffect.NewDispatcher(pool, ledger, map[string]sideeffect.Provider{
		"webhook.order-paid": hook,
		"email.receipt":      email,
	}, &sideeffect.DispatcherConfig{Concurrency: 16, CallTimeout: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	_ = d.Run(ctx) // returns after a graceful drain
}

// Providers classify their errors: Definite when the provider certainly did
// not act, RetryAfter when it asked for a delay; anything else is retried
// with backoff and the same key.
func ExampleDefinite() {
	rejected := sideeffect.Definite(errors.New("422: invalid address"))
	busy := sideeffect.RetryAfter(errors.New("503"), 30*time.Second)
	reset := errors.New("connection reset by peer")

	d, _ := sideeffect.RetryAfterOf(busy)
	fmt.Println(sideeffect.IsDefinite(rejected), sideeffect.IsDefinite(busy), d, sideeffect.IsDefinite(reset))
	// Output: true false 30s false
}
