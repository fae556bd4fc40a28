package broker_test

import (
	"context"
	"testing"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
)

// passThrough is the least decorator: each method calls the wrapped
// publisher's.
type passThrough struct{ inner broker.Publisher }

func (p passThrough) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	return p.inner.Publish(ctx, msgs)
}

func (p passThrough) PublishChain(ctx context.Context, msgs []broker.Message, prev []int) []broker.Result {
	return p.inner.(broker.ChainPublisher).PublishChain(ctx, msgs, prev)
}

func (p passThrough) Connected() bool { return p.inner.(broker.ConnectedPublisher).Connected() }

// Decorate gives a decorator exactly the capabilities of the publisher it
// wraps.
func TestDecorateKeepsExactlyTheWrappedCapabilities(t *testing.T) {
	t.Parallel()
	brokertest.RunDecorator(t, func(inner broker.Publisher) broker.Publisher {
		return broker.Decorate(inner, passThrough{inner})
	})
}
