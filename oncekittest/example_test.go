package oncekittest_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/sideeffect"
)

// receipts is the code under test, as a user writes it: for each paid order
// it records a receipt email in the consumer's transaction.
type receipts struct{ ledger *sideeffect.Ledger }

func (h receipts) Handle(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
	_, err := h.ledger.Record(ctx, tx, sideeffect.Effect{SourceID: m.Key, Kind: "email.receipt", Payload: m.Payload})
	return err
}

// A user's test of that handler, end to end on a real PostgreSQL and a real
// JetStream: the event goes out through the outbox, arrives twice, and the
// receipt is sent once.
func TestReceiptIsSentOncePerOrder(t *testing.T) {
	ctx := context.Background()
	db := oncekittest.NewDB(t)
	n := oncekittest.NewNATS(t)
	stream, subject := strings.ToUpper(oncekittest.Name(t)), oncekittest.Name(t)+".paid"
	_, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: stream, Subjects: []string{subject}})
	require.NoError(t, err)

	// The producer writes the event in its transaction.
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	paid := broker.Message{ID: oncekit.DeriveID("order-1", "OrderPaid"), Subject: subject, Key: "order-1", Payload: []byte(`{"total":42}`)}
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(ctx, tx, paid)
		oncekittest.RequireEnqueued(ctx, t, tx, ob, paid.ID) // visible in the transaction
		return err
	}))
	pub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	relay, err := outbox.NewRelay(db.Pool, ob, pub, nil)
	require.NoError(t, err)
	oncekittest.DrainRelay(ctx, t, relay, db.Pool, ob)
	require.True(t, oncekittest.RequireEnqueued(ctx, t, db.Pool, ob, paid.ID).Published)

	// The same event reaches the stream a second time as a new message.
	copyMsg := natsjs.NATSMsg(paid)
	copyMsg.Header.Del(broker.HeaderMsgID)
	_, err = n.JS.PublishMsg(ctx, copyMsg)
	require.NoError(t, err)

	// The consumer handles it once.
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: stream, Durable: "receipts"})
	require.NoError(t, err)
	consumer, err := inbox.NewConsumer(db.Pool, src, receipts{ledger}, &inbox.Config{Name: "receipts", Schema: db.Schema})
	require.NoError(t, err)
	stats := oncekittest.DrainConsumer(ctx, t, consumer, 2) // the event and its copy
	require.Equal(t, inbox.Stats{Processed: 1, Duplicates: 1}, stats)
	receipt := oncekittest.RequireEffect(ctx, t, db.Pool, ledger, "order-1", "email.receipt")
	require.Equal(t, sideeffect.StatePending, receipt.State)

	// The dispatcher sends the receipt once, with its derived key.
	var calls atomic.Int32
	email := sideeffect.ProviderFunc(func(ctx context.Context, c sideeffect.Call) (string, error) {
		calls.Add(1)
		require.Equal(t, oncekit.DeriveKey("order-1", "email.receipt"), c.Key)
		return "sent-1", nil
	})
	dispatcher, err := sideeffect.NewDispatcher(db.Pool, ledger, map[string]sideeffect.Provider{"email.receipt": email}, nil)
	require.NoError(t, err)
	oncekittest.DrainDispatcher(ctx, t, dispatcher, db.Pool, ledger)
	receipt = oncekittest.RequireEffect(ctx, t, db.Pool, ledger, "order-1", "email.receipt")
	require.Equal(t, sideeffect.StateConfirmed, receipt.State)
	require.Equal(t, "sent-1", receipt.ProviderRef)
	require.EqualValues(t, 1, calls.Load())
}
