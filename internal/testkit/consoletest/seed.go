// Package consoletest seeds a schema with one payment at every layer, for
// the console's tests: its handler tests and its browser test.
package consoletest

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/tracecontext"
)

// The seeded payment's identity, as a client and the service name it.
const (
	Tenant    = "acme"
	Operation = "create-payment"
	Key       = "pay-7f3a"
	EventName = "PaymentCreated"
	Subject   = "payments.created"
	// Secret is in the payloads and the stored response: a page must not
	// show it unless revealed.
	Secret = "card-4242-secret"
	// TraceID is the W3C trace the payment's effect was recorded in and
	// its dead letter's message carried.
	TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
)

// Seeded is what Seed wrote.
type Seeded struct {
	PaymentID    uuid.UUID // Info.ID: DeriveID(Tenant, Key)
	EventID      uuid.UUID // DeriveID(PaymentID, EventName)
	ParkedID     uuid.UUID // another event, parked
	DeadLetterID int64     // the event's dead letter at the "mailer" consumer
	EffectID     int64     // the payment's capture, unknown
}

// Seed writes, in db's schema, the payment Key of Tenant at every layer:
// its edge record (completed, with a stored response), its event in the
// outbox (published by the relay's cursor), the "ledger" consumer's claim
// of it, the "mailer" consumer's dead letter of it, and its capture effect
// left unknown; plus an unknown edge record (key "pay-lost") and a parked
// event.
func Seed(t testing.TB, db *testenv.DB) Seeded {
	t.Helper()
	ctx := context.Background()
	s := Seeded{PaymentID: oncekit.DeriveID(Tenant, Key)}
	s.EventID = oncekit.DeriveID(s.PaymentID.String(), EventName)
	s.ParkedID = oncekit.DeriveID("parked", EventName)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	must(t, err)
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	must(t, err)
	store, err := inbox.NewStore(db.Schema)
	must(t, err)
	payload := []byte(fmt.Sprintf(`{"payment_id":%q,"card":%q}`, s.PaymentID, Secret))
	must(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, status_code,
				response_headers, response_body, completed_at, expires_at, body_expires_at, operation_id)
			VALUES ($1, $2, $3, '\x01', 'completed', 201, $4, $5, now(), now() + interval '7 days', now() + interval '1 day', $6)`,
			Tenant, Operation, idempotency.StoredKey(Key), fmt.Sprintf(`{"Location":["/payments/%s"]}`, s.PaymentID),
			[]byte(fmt.Sprintf(`{"id":%q,"card":%q}`, s.PaymentID, Secret)), s.PaymentID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (tenant, operation, key, fingerprint, state, unknown_reason, expires_at)
			VALUES ($1, $2, $3, '\x02', 'unknown', 'charge: the provider did not answer', now() + interval '7 days')`,
			Tenant, Operation, idempotency.StoredKey("pay-lost")); err != nil {
			return err
		}
		if _, err := ob.Enqueue(ctx, tx, broker.Message{ID: s.EventID, Subject: Subject, Key: "acct-1", Payload: payload},
			broker.Message{ID: s.ParkedID, Subject: Subject, Key: "acct-2", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id) VALUES ('ledger', $1)`, s.EventID); err != nil {
			return err
		}
		traced := tracecontext.ContextWith(ctx, tracecontext.Context{Traceparent: "00-" + TraceID + "-00f067aa0ba902b7-01"})
		r, err := ledger.Record(traced, tx, sideeffect.Effect{SourceID: s.PaymentID.String(), Kind: "provider.capture", Payload: payload})
		if err != nil {
			return err
		}
		s.EffectID = r.ID
		_, err = tx.Exec(ctx, `UPDATE side_effects SET state = 'unknown', next_attempt_at = 'infinity',
			last_error = 'capture: connection reset after the request was sent' WHERE id = $1`, s.EffectID)
		return err
	}))
	// The relay published the payment's event (its partition's cursor is
	// past it) and parked the other.
	_, err = db.Pool.Exec(ctx, `UPDATE outbox SET parked_at = now(), attempts = 5, last_error = 'nats: maximum payload exceeded' WHERE id = $1`, s.ParkedID)
	must(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE relay_partitions p SET cursor_txid = o.txid, cursor_seq = o.seq
		FROM outbox o WHERE o.id = $1 AND p.partition = o.partition`, s.EventID)
	must(t, err)
	_, err = store.InsertDeadLetter(ctx, db.Pool, inbox.DeadLetter{Consumer: "mailer", MessageID: s.EventID.String(),
		Subject: Subject, Payload: payload, Headers: map[string][]string{"Nats-Msg-Id": {s.EventID.String()}, "Traceparent": {"00-" + TraceID + "-b7ad6b7169203331-01"}},
		Reason: "smtp: 550 mailbox of user 1234 is full", Attempts: 5})
	must(t, err)
	must(t, db.Pool.QueryRow(ctx, `SELECT id FROM dead_letters WHERE message_id = $1`, s.EventID.String()).Scan(&s.DeadLetterID))
	return s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
