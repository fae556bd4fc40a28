package eventsig_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/brokertest"
	"github.com/oncekit/oncekit/eventsig"
)

// The signing publisher has exactly the capabilities of the publisher it
// wraps: it neither drops one (the relay would lose PublishChain's single
// round, or tell an outage from refused messages no more) nor claims one.
func TestSignPublisherKeepsExactlyTheWrappedCapabilities(t *testing.T) {
	t.Parallel()
	_, priv := newKey(t)
	signer, err := eventsig.NewSigner("k1", priv)
	require.NoError(t, err)
	brokertest.RunDecorator(t, func(inner broker.Publisher) broker.Publisher {
		return eventsig.SignPublisher(inner, signer)
	})
}
