package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/oncekit/oncekit/examples/kafka/kafkabroker"
	"github.com/oncekit/oncekit/examples/kafka/kafkatest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/watermill/aspubsub"
)

// Watermill's universal suite on the half of oncekit's watermill bridge
// that applies to Kafka: aspubsub's Publisher writes to the outbox, one
// relay publishes to Kafka through kafkabroker, and watermill-kafka's own
// subscriber (a consumer group per watermill group) reads it. The other
// half, aspubsub's Subscriber, runs the inbox in its ordered mode, which
// needs a broker.OrderedSource (JetStream's): Kafka's asbroker source is
// not one. The topics the suite makes are created on first use.
func TestWatermillUniversalSuiteOnKafka(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, brokers := kafkatest.New(t, kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	db := testenv.NewDB(t)

	kcfg := kafkabroker.Config{Brokers: brokers, SessionTimeout: testSession, AutoCreateTopics: true}
	kpub, err := kafkabroker.NewPublisher(kcfg)
	require.NoError(t, err)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	relay, err := outbox.NewRelay(db.Pool, ob, kpub, &outbox.RelayConfig{PollInterval: 20 * time.Millisecond,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, Logger: quiet})
	require.NoError(t, err)
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-relayDone; _ = kpub.Close() })

	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := aspubsub.NewPublisher(db.Pool, &aspubsub.PublisherConfig{Outbox: outbox.Config{Schema: db.Schema}})
		require.NoError(t, err)
		c := kcfg
		c.Group = group
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, Unmarshaler: kafkabroker.Marshaler(),
			ConsumerGroup: group, OverwriteSaramaConfig: kafkabroker.SubscriberSarama(c)}, watermill.NopLogger{})
		require.NoError(t, err)
		wsub := newUUIDSubscriber(sub)
		t.Cleanup(func() { _ = wsub.Close() })
		return pub, wsub
	}

	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:      true,
		ExactlyOnceDelivery: false,
		// aspubsub keys a message by its topic: one partition per topic,
		// read in order.
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		// Off: kfake lives in this process; TestKillsRelayAndConsumers
		// SIGKILLs the relay and consumer processes instead.
		RestartServiceCommand: nil,
		// Off: the publisher's context does not travel through the outbox.
		ContextPreserved: false,
		ForceShort:       true,
	}, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return newPubSub(t, "default")
	}, func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return newPubSub(t, group)
	})
}

// uuidSubscriber gives each message back the watermill UUID it was
// published with (aspubsub carries it in a header; the message's own UUID
// on the wire is the event ID). Its Close returns once every channel it
// handed out is closed.
type uuidSubscriber struct {
	message.Subscriber
	fwd     *sync.WaitGroup
	closing chan struct{}
	once    *sync.Once
}

func newUUIDSubscriber(sub message.Subscriber) uuidSubscriber {
	return uuidSubscriber{Subscriber: sub, fwd: &sync.WaitGroup{}, closing: make(chan struct{}), once: &sync.Once{}}
}

func (s uuidSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	s.fwd.Add(1)
	go func() {
		defer s.fwd.Done()
		defer close(out)
		for m := range in {
			if u := m.Metadata.Get(aspubsub.HeaderUUID); u != "" {
				m.UUID = u
			}
			select {
			case out <- m:
			case <-s.closing:
				m.Nack()
			}
		}
	}()
	return out, nil
}

func (s uuidSubscriber) Close() error {
	s.once.Do(func() { close(s.closing) })
	err := s.Subscriber.Close()
	s.fwd.Wait()
	return err
}
