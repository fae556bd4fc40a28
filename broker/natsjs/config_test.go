package natsjs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker/natsjs"
)

// A nil connection or JetStream context is refused as a bad config is, with
// an error wrapping ErrInvalidConfig, before anything talks to a server.
func TestNilConnectionWrapsErrInvalidConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := natsjs.NewPublisher(nil, nil)
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	require.EqualError(t, err, "natsjs: invalid config: NewPublisher: nil connection")
	_, err = natsjs.NewSource(ctx, nil, &natsjs.SourceConfig{Stream: "s", Durable: "d"})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
	_, err = natsjs.EnsureStream(ctx, nil, natsjs.StreamConfig{Name: "s", Subjects: []string{"s.>"}})
	require.ErrorIs(t, err, natsjs.ErrInvalidConfig)
}
