package wmbroker_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncekit/oncekit/broker/wmbroker"
	"github.com/oncekit/oncekit/internal/cfgerr/cfgerrtest"
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
		cfg           wmbroker.SourceConfig
		field, detail string
	}{
		{wmbroker.SourceConfig{}, "wmbroker: SourceConfig.Topics", "required"},
		{wmbroker.SourceConfig{Topics: topics, Subscriptions: -1}, "wmbroker: SourceConfig.Subscriptions", "-1 is negative"},
		{wmbroker.SourceConfig{Topics: topics, AckWait: -1}, "wmbroker: SourceConfig.AckWait", "-1ns is negative"},
		{wmbroker.SourceConfig{Topics: topics, Duplicates: -1}, "wmbroker: SourceConfig.Duplicates", "-1ns is negative"},
	} {
		_, err := wmbroker.NewSource(ctx, ps, &tc.cfg)
		cfgerrtest.RequireField(t, err, wmbroker.ErrInvalidConfig, tc.field, tc.detail)
	}
	_, err := wmbroker.NewPublisher(ps, &wmbroker.PublisherConfig{Parallel: -1})
	cfgerrtest.RequireField(t, err, wmbroker.ErrInvalidConfig, "wmbroker: PublisherConfig.Parallel", "-1 is negative")
}
