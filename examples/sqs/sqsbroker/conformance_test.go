package sqsbroker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
	"github.com/oncekit/oncekit/examples/sqs/sqsbroker"
)

// ackWait is the visibility timeout the suite's sources ask for: the time
// SQS takes to redeliver what a closed consumer held.
const ackWait = 2 * time.Second

// harness runs the suite on a queue of its own per test, standard or FIFO.
func harness(fifo bool) brokertest.Harness {
	return brokertest.Harness{
		// A standard queue neither dedups nor keeps order; a FIFO queue
		// drops a copy by MessageDeduplicationId without saying so and
		// keeps a message group's order. ApproximateReceiveCount counts
		// the deliveries to every consumer.
		Features: brokertest.Features{
			DedupSilently: fifo, OrderedByKey: fifo,
			AttemptsAcrossConsumers: true, Redelivery: ackWait,
		},
		New: func(t *testing.T) brokertest.Env {
			client := fauxqs.Shared(t).Client()
			queue := fauxqs.NewQueue(t, client, fifo, nil)
			const subject, refused = "orders", "missing"
			pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{
				FIFO: fifo,
				QueueURL: func(s string) string {
					if s == refused {
						return queue + "-missing" // no such queue
					}
					return queue
				},
			})
			require.NoError(t, err)
			return brokertest.Env{
				Publisher: pub, Subject: subject, Refused: refused,
				Open: func(t *testing.T) (broker.Source, func()) {
					src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{
						QueueURL: queue, Subject: subject, FIFO: fifo, AckWait: ackWait, WaitTime: time.Second,
					})
					require.NoError(t, err)
					return src, src.Close
				},
			}
		},
	}
}

// The adapter passes the conformance suite on a standard queue.
func TestConformanceStandard(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, harness(false))
}

// The adapter passes the conformance suite on a FIFO queue, its
// deduplication by event ID included.
func TestConformanceFIFO(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, harness(true))
}
