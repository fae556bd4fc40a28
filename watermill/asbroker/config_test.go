package asbroker_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncekit/oncekit/internal/cfgerr/cfgerrtest"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// A bad config is refused before anything is subscribed or published, with
// an error naming the field; a negative value is refused, not taken for the
// default.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	ctx := context.Background()
	topics := []string{"t"}
	for _, tc := range []struct {
		cfg           asbroker.SourceConfig
		field, detail string
	}{
		{asbroker.SourceConfig{}, "asbroker: SourceConfig.Topics", "required"},
		{asbroker.SourceConfig{Topics: topics, Subscriptions: -1}, "asbroker: SourceConfig.Subscriptions", "-1 is negative"},
		{asbroker.SourceConfig{Topics: topics, AckWait: -1}, "asbroker: SourceConfig.AckWait", "-1ns is negative"},
		{asbroker.SourceConfig{Topics: topics, Duplicates: -1}, "asbroker: SourceConfig.Duplicates", "-1ns is negative"},
	} {
		_, err := asbroker.NewSource(ctx, ps, &tc.cfg)
		cfgerrtest.RequireField(t, err, asbroker.ErrInvalidConfig, tc.field, tc.detail)
	}
	_, err := asbroker.NewPublisher(ps, &asbroker.PublisherConfig{Concurrency: -1})
	cfgerrtest.RequireField(t, err, asbroker.ErrInvalidConfig, "asbroker: PublisherConfig.Concurrency", "-1 is negative")
}
