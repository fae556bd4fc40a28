package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// natsjs passes the broker conformance suite: JetStream dedups by
// Nats-Msg-Id, keeps publish order, and counts deliveries itself.
func TestConformance(t *testing.T) {
	t.Parallel()
	const ackWait = time.Second
	brokertest.Run(t, brokertest.Harness{
		Features: brokertest.Features{DedupByID: true, OrderedByKey: true, AttemptsAcrossConsumers: true, Redelivery: ackWait},
		New: func(t *testing.T) brokertest.Env {
			ctx := context.Background()
			n := testenv.NewNATS(t)
			name := testenv.Name(t)
			_, err := natsjs.EnsureStream(ctx, n.JS, natsjs.StreamConfig{Name: name, Subjects: []string{name + ".in"}})
			require.NoError(t, err)
			pub, err := natsjs.NewPublisher(n.Conn, nil)
			require.NoError(t, err)
			return brokertest.Env{
				Publisher: pub,
				Subject:   name + ".in",
				Refused:   name + ".nostream",
				Open: func(t *testing.T) (broker.Source, func()) {
					src, err := natsjs.NewSource(ctx, n.JS, &natsjs.SourceConfig{Stream: name, Durable: "d", AckWait: ackWait})
					require.NoError(t, err)
					return src, src.Close
				},
			}
		},
	})
}
