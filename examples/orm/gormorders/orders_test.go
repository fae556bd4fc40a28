package gormorders_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/examples/orm/gormorders"
	"github.com/oncekit/oncekit/examples/orm/ormtest"
	"github.com/oncekit/oncekit/inbox"
)

func open(t *testing.T, w *ormtest.World) *gorm.DB {
	t.Helper()
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: w.DB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	return gdb
}

var errRollback = errors.New("roll back")

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			t.Parallel()
			w := ormtest.New(t)
			gdb := open(t, w)
			ctx := context.Background()
			o := &gormorders.Order{ID: uuid.New(), Customer: "ana", Amount: 4200}
			err := gdb.Transaction(func(tx *gorm.DB) error {
				if err := gormorders.PlaceOrder(ctx, tx, w.Outbox, w.Subject, o); err != nil {
					return err
				}
				if !commit {
					return errRollback
				}
				return nil
			})
			eventID := oncekit.DeriveID(o.ID.String(), "OrderPlaced")
			if commit {
				require.NoError(t, err)
				w.RequireCommitted(o.ID, eventID)
			} else {
				require.ErrorIs(t, err, errRollback)
				w.RequireRolledBack(o.ID, eventID)
			}
		})
	}
}

func TestPlaceOrderOutsideTransaction(t *testing.T) {
	t.Parallel()
	w := ormtest.New(t)
	err := gormorders.PlaceOrder(context.Background(), open(t, w), w.Outbox, w.Subject, &gormorders.Order{ID: uuid.New()})
	require.ErrorIs(t, err, gormorders.ErrNotInTransaction)
	require.Equal(t, 0, w.Count(`SELECT count(*) FROM orders`))
}

// The inbox handler's GORM writes commit with the claim (an order with an
// amount) or roll back with it (an order refused: dead-lettered).
func TestHandler(t *testing.T) {
	t.Parallel()
	w := ormtest.New(t)
	ctx := context.Background()
	nc, js := w.NATS()
	stream := w.Stream(js)
	src, err := natsjs.NewSource(ctx, js, &natsjs.SourceConfig{Stream: stream, Durable: "orders"})
	require.NoError(t, err)
	t.Cleanup(src.Close)
	c, err := inbox.NewConsumer(w.Pool, src, gormorders.Handler(open(t, w)), &inbox.Config{
		Name: "orders", Schema: w.Schema, Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	pub, err := natsjs.NewPublisher(nc, nil)
	require.NoError(t, err)
	good := gormorders.Order{ID: uuid.New(), Customer: "ana", Amount: 10}
	bad := gormorders.Order{ID: uuid.New(), Customer: "bo"}
	var msgs []broker.Message
	for _, o := range []gormorders.Order{good, bad} {
		b, _ := json.Marshal(o)
		msgs = append(msgs, broker.Message{ID: o.ID, Subject: w.Subject, Payload: b})
	}
	for _, r := range pub.Publish(ctx, msgs) {
		require.NoError(t, r.Err)
	}
	require.Eventually(t, func() bool { s := c.Stats(); return s.Processed == 1 && s.DeadLettered == 1 },
		30*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, w.Count(`SELECT count(*) FROM orders WHERE id = $1 AND amount = 10`, good.ID))
	require.Equal(t, 0, w.Count(`SELECT count(*) FROM orders WHERE id = $1`, bad.ID))
}
