package drift_test

import (
	"context"
	"fmt"
	"os"
	"strings"

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

// Rules from a YAML file: a capture per payment, matched on the payment ID in
// the effect's payload, read over the last day only.
func ExampleReadRules() {
	cfg := drift.Config{}
	err := drift.ReadRules(strings.NewReader(`
window: 24h
rules:
  - name: payment_captures
    expect:
      kind: payment.capture
      sources: SELECT id FROM payments WHERE created_at >= {since}
      business_id: $.payment_id
`), &cfg)
	if err != nil {
		panic(err)
	}
	r := cfg.Rules[0]
	fmt.Println(r.Name, r.Expect.Kind, r.Expect.BusinessID, cfg.Window)
	// Output: payment_captures payment.capture $.payment_id 24h0m0s
}
