package aspubsub_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/watermill/aspubsub"
)

// oncekit as a watermill Pub/Sub passes watermill's universal suite: the
// Publisher writes to the outbox, one relay publishes to JetStream, and each
// Subscribe runs an inbox consumer. Every Pub/Sub the suite makes shares
// the database, the relay and the stream, as the processes of one service
// do.
func TestWatermillUniversalSuite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	// Each message handed to watermill holds its claim's transaction until
	// the ack: one connection per subscription at work.
	pcfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	pcfg.MaxConns = 24
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	n := testenv.NewNATS(t)
	stream := testenv.Name(t)
	_, err = natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: stream, Subjects: []string{"wm.>"}})
	require.NoError(t, err)
	jsPub, err := natsjs.NewPublisher(n.Conn, nil)
	require.NoError(t, err)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	relay, err := outbox.NewRelay(pool, ob, jsPub, &outbox.RelayConfig{PollInterval: 50 * time.Millisecond,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, Logger: quiet})
	require.NoError(t, err)
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-relayDone })

	// A durable per (group, topic); its name may not hold dots.
	open := func(ctx context.Context, group, topic string) (broker.Source, func(), error) {
		src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{
			Stream: stream, Durable: strings.ReplaceAll(group+"_"+topic, ".", "_"),
			FilterSubjects: []string{topic}, AckWait: 2 * time.Second, Prefetch: 64,
		})
		if err != nil {
			return nil, nil, err
		}
		return src, src.Close, nil
	}
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := aspubsub.NewPublisher(pool, &aspubsub.PublisherConfig{Outbox: outbox.Config{Schema: db.Schema}})
		require.NoError(t, err)
		sub, err := aspubsub.NewSubscriber(pool, &aspubsub.SubscriberConfig{Group: group, Source: open, Schema: db.Schema, Logger: quiet})
		require.NoError(t, err)
		// Some of the suite's tests leave their subscriber open: closed
		// when the test ends, so that no subscription outlives it.
		t.Cleanup(func() { _ = sub.Close() })
		return pub, sub
	}

	tests.TestPubSub(t, tests.Features{
		ConsumerGroups: true,
		// Off: delivery to a watermill handler is at least once; a process
		// that dies between the ack and the claim's commit hands the message
		// out again (PostgreSQL writes are exactly once through Inbox).
		ExactlyOnceDelivery: false,
		// Each topic is one ordering key, relayed in order and consumed in
		// order by one subscriber...
		GuaranteedOrder: true,
		// ...but the members of one group split a topic's messages between
		// them, so order holds with a single subscriber only.
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		// Off: no restart command for the suite's broker restart (run not in
		// parallel); the relay and inbox crash tests restart NATS and
		// SIGKILL processes instead.
		RestartServiceCommand: nil,
		RequireSingleInstance: false,
		// Off: the members of one group share its messages; a new member
		// does not get those another member already consumed (a new group
		// gets them all, which TestConsumerGroups checks).
		NewSubscriberReceivesOldMessages: false,
		// Off: the publisher's context does not travel through the outbox.
		ContextPreserved: false,
		// On: the long variants (5,000 to 10,000 messages on one topic, 50
		// subscribers) did not finish within go test's 10-minute timeout on
		// the 2-core CI machine: a topic is one ordering key, relayed one
		// acknowledgement after another, and each message handed out holds
		// a PostgreSQL transaction until its ack.
		ForceShort: true,
		// Topics under one stream's subjects (wm.>).
		GenerateTopicFunc: func(tctx tests.TestContext) string { return "wm." + string(tctx.TestID) },
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return newPubSub(t, "default")
	}, func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return newPubSub(t, group)
	})
}

var quiet = slog.New(slog.DiscardHandler)
