package main

import (
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/outbox"
)

// createPaymentApart is the payment handler of the edge-stores-after-commit
// build: it commits the payment and its event in a transaction of its own,
// and the edge (in its separate mode) stores the response after that
// commit. A crash in between leaves the payment without its response; a
// retry finds the key's claim abandoned and runs the handler again.
func createPaymentApart(pool *pgxpool.Pool, ob *outbox.Outbox, cfg *config) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, ok := readPayment(w, r)
		if !ok {
			return
		}
		info, _ := idempotency.FromRequest(r)
		var resp PaymentResponse
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) (err error) {
			resp, err = insertPayment(r.Context(), tx, ob, cfg, info.ID().String(), req)
			return err
		})
		writeCreated(w, resp, err)
	}
}
