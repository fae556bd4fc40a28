package console_test

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/console"
)

// A service mounts the console under a path prefix, behind a reverse proxy
// that authenticates operators and names them in a header.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		return
	}
	defer pool.Close()
	con, err := console.New(pool, &console.Config{
		Schema:        "oncekit",
		Prefix:        "/ops/oncekit",
		Writes:        true,
		TrustedHeader: "X-Forwarded-User",
		Derive:        []string{"PaymentCreated"}, // event IDs: oncekit.DeriveID(paymentID, "PaymentCreated")
	})
	if err != nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/oncekit/", con)
	_ = http.ListenAndServe("127.0.0.1:8080", mux) // loopback: the proxy in front
}
