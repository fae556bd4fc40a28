package brokertests_test

import (
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// newQueue declares a durable queue named after the test, deleted at its
// end. It is declared before anything is published: RabbitMQ drops (and
// confirms) a message routed to no queue.
func newQueue(t *testing.T, uri string, args amqp091.Table) string {
	t.Helper()
	q := testenv.Name(t)
	require.NoError(t, declareQueue(uri, q, args))
	t.Cleanup(func() {
		_ = onChannel(uri, func(ch *amqp091.Channel) error {
			_, err := ch.QueueDelete(q, false, false, false)
			return err
		})
	})
	return q
}

// The watermill adapter on RabbitMQ passes the conformance suite. RabbitMQ
// does not dedup by ID (the inbox's claim does), keeps a queue's order for
// one consumer, and does not count deliveries (the Source counts its own).
func TestConformanceRabbitMQ(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Features: brokertest.Features{OrderedByKey: true},
		New: func(t *testing.T) brokertest.Env {
			uri := testenv.RabbitMQURL(t)
			pub, closePub, err := newPublisher("rabbitmq", uri)
			require.NoError(t, err)
			t.Cleanup(closePub)
			queue := newQueue(t, uri, nil)
			return brokertest.Env{
				Publisher: pub, Subject: queue,
				// A queue that refuses every publish: RabbitMQ nacks the
				// publisher confirm.
				Refused: newQueue(t, uri, amqp091.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"}),
				Open: func(t *testing.T) (broker.Source, func()) {
					src, closeSrc, err := newSource("rabbitmq", uri, queue, nil)
					require.NoError(t, err)
					t.Cleanup(closeSrc)
					return src, closeSrc
				},
			}
		},
	})
}
