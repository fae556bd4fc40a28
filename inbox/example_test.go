package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
)

// A consumer whose handler writes in the claim's transaction. Decoding
// failures are permanent: the message goes to dead_letters instead of being
// retried forever.
func Example() {
	run := func(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) error {
		src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: "PAYMENTS", Durable: "billing"})
		if err != nil {
			return err
		}
		defer src.Close()
		handle := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
			var p struct{ Amount int64 }
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				return inbox.Permanent(fmt.Errorf("decode payment: %w", err))
			}
			_, err := tx.Exec(ctx, `INSERT INTO invoices (event_id, amount) VALUES ($1, $2)`, msg.ID, p.Amount)
			return err
		})
		c, err := inbox.NewConsumer(pool, src, handle, &inbox.Config{Name: "billing", BatchSize: 200, Concurrency: 4})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
	_ = run
}

// An ordered consumer: the events of one account apply in stream order,
// whichever of the processes running this code receives them and however
// often one of them crashes; different accounts run in parallel. The
// publisher sets the key (broker.Message.Key, the Oncekit-Key header).
func ExampleConfig_ordered() {
	run := func(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, h inbox.Handler) error {
		src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: "ACCOUNTS", Durable: "ledger"})
		if err != nil {
			return err
		}
		defer src.Close()
		c, err := inbox.NewConsumer(pool, src, h, &inbox.Config{Name: "ledger", Ordered: true, BatchSize: 200})
		if errors.Is(err, inbox.ErrOrderUnsupported) {
			return fmt.Errorf("this source cannot keep per-key order: %w", err)
		}
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
	_ = run
}

// A batch consumer's handler that only writes queues its statements: a
// batch of 200 then sends its 200 inserts in one round trip, with the
// commit, instead of one round trip each. A queued insert that fails fails
// its own message, which is retried alone.
func ExampleQueue() {
	handle := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		var p struct{ Amount int64 }
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return inbox.Permanent(fmt.Errorf("decode payment: %w", err))
		}
		return inbox.Queue(ctx, tx, `INSERT INTO invoices (event_id, amount) VALUES ($1, $2)`, msg.ID, p.Amount)
	})
	_ = handle
}

// Claims must outlive the last redelivery a source can make: with a 30 s ack
// wait, unlimited deliveries, 25 attempts and a 5 minute backoff cap, that is
// 25 × 5.5 minutes.
func ExampleHorizon() {
	l := broker.SourceLimits{AckWait: 30 * time.Second, MaxDeliver: -1, Duplicates: 10 * time.Minute}
	fmt.Println(inbox.Horizon(l, 25, 5*time.Minute))
	// Output: 2h17m30s
}
