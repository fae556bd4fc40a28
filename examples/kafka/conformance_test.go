package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
	"github.com/oncekit/oncekit/examples/kafka/kafkabroker"
	"github.com/oncekit/oncekit/examples/kafka/kafkatest"
)

// testSession is the consumer groups' session timeout in the tests: a
// killed member's partitions move within it.
const testSession = 2 * time.Second

// The adapter the example uses (watermill-kafka through asbroker) passes the
// broker conformance suite on a three-broker cluster. Kafka does not dedup
// by ID (the inbox's claim does) and does not count deliveries (the Source
// counts its own). Each test's topic has one partition: the suite's order
// test reads two keys' messages in publish order from one source, which
// Kafka promises within a partition only (TestKillsRelayAndConsumers checks
// per-key order over several partitions).
func TestConformanceKafka(t *testing.T) {
	t.Parallel()
	_, brokers := kafkatest.New(t)
	cfg := kafkabroker.Config{Brokers: brokers, Group: "g", SessionTimeout: testSession}
	brokertest.Run(t, brokertest.Harness{
		Features: brokertest.Features{OrderedByKey: true, Redelivery: 10 * time.Second},
		New: func(t *testing.T) brokertest.Env {
			pub, err := kafkabroker.NewPublisher(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = pub.Close() })
			topic := kafkatest.Topic(t, brokers, 1)
			return brokertest.Env{
				Publisher: pub, Subject: topic,
				// No such topic, and the cluster creates none.
				Refused: topic + ".missing",
				Open: func(t *testing.T) (broker.Source, func()) {
					src, err := kafkabroker.NewSource(context.Background(), cfg, topic)
					require.NoError(t, err)
					t.Cleanup(src.Close)
					return src, src.Close
				},
			}
		},
	})
}
