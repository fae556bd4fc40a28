package aspubsub_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/watermill/aspubsub"
)

// A watermill handler whose writes commit with the message's claim.
func Example() {
	setup := func(pool *pgxpool.Pool, router *message.Router, sub message.Subscriber) error {
		in, err := aspubsub.New(pool, &aspubsub.Config{Name: "billing"})
		if err != nil {
			return err
		}
		router.AddNoPublisherHandler("billing", "payments", sub,
			in.NoPublishHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
				if len(msg.Payload) == 0 {
					return inbox.Permanent(fmt.Errorf("empty payment"))
				}
				_, err := tx.Exec(ctx, `INSERT INTO invoices (event_id, body) VALUES ($1, $2)`,
					msg.Metadata.Get("Oncekit-Event-Id"), msg.Payload)
				return err
			}))
		return nil
	}
	_ = setup
}

// The dedup identity of a watermill message: the oncekit event ID when the
// producer set one, else the watermill UUID.
func ExampleDefaultMessageID() {
	msg := message.NewMessage("not-a-uuid", nil)
	msg.Metadata.Set("Oncekit-Event-Id", "0b9e3f62-8f7a-4d3c-9f51-2b6f7c1d2e3f")
	id, err := aspubsub.DefaultMessageID(msg)
	fmt.Println(id, err)
	// Output: 0b9e3f62-8f7a-4d3c-9f51-2b6f7c1d2e3f <nil>
}
