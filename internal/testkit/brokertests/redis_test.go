package brokertests_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// newStream names a Redis stream after the test, deleted at its end, and
// returns a client on the server.
func newStream(t *testing.T, addr string) (string, *redis.Client) {
	t.Helper()
	stream := testenv.Name(t)
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() {
		_ = client.Del(context.Background(), stream).Err()
		_ = client.Close()
	})
	return stream, client
}

// The watermill adapter on Redis Streams passes the conformance suite: no
// dedup by ID, a stream's order for one consumer, redelivery of a gone
// consumer's messages by a claim after MaxIdleTime.
func TestConformanceRedisStreams(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Features: brokertest.Features{OrderedByKey: true, Redelivery: 2 * redisClaim},
		New: func(t *testing.T) brokertest.Env {
			addr := testenv.RedisAddr(t)
			pub, closePub, err := newPublisher("redis", addr)
			require.NoError(t, err)
			t.Cleanup(closePub)
			stream, client := newStream(t, addr)
			// A key of the wrong type: every XADD to it fails.
			refused := stream + "_string"
			require.NoError(t, client.Set(context.Background(), refused, "not a stream", time.Hour).Err())
			t.Cleanup(func() { _ = client.Del(context.Background(), refused).Err() })
			return brokertest.Env{
				Publisher: pub, Subject: stream, Refused: refused,
				Open: func(t *testing.T) (broker.Source, func()) {
					src, closeSrc, err := newSource("redis", addr, stream, nil)
					require.NoError(t, err)
					t.Cleanup(closeSrc)
					return src, closeSrc
				},
			}
		},
	})
}
