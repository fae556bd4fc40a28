package drift_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/drift"
)

// A nightly job: every paid order must have exactly one receipt email in the
// side-effect ledger, and the rest of the chain must be healthy.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	checker, err := drift.New(pool, &drift.Config{
		Rules: []drift.Rule{
			drift.ExpectEffects("paid_order_receipts", "email.receipt",
				`SELECT id FROM orders WHERE paid_at < now() - interval '10 minutes'`),
		},
	})
	if err != nil {
		panic(err)
	}
	rep, err := checker.Run(ctx)
	if err != nil {
		panic(err)
	}
	_ = rep.WriteTable(os.Stdout)
	if rep.Drifted() {
		fmt.Println("drift found")
		os.Exit(1)
	}
}
