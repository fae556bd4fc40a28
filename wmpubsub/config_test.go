package wmpubsub_test

import (
	"context"
	"testing"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/cfgerr/cfgerrtest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/wmpubsub"
)

// A bad config is refused with an error naming the field, wrapping
// inbox.ErrInvalidConfig.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := wmpubsub.New(db.Pool, &wmpubsub.Config{})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "wmpubsub: Config.Name", "required")
	_, err = wmpubsub.New(db.Pool, &wmpubsub.Config{Name: "n", Schema: "no such-schema"})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "wmpubsub: Config.Schema", "")

	open := func(context.Context, string, string) (broker.Source, func(), error) { return nil, func() {}, nil }
	_, err = wmpubsub.NewSubscriber(db.Pool, &wmpubsub.SubscriberConfig{})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "wmpubsub: SubscriberConfig.Source", "required")
	_, err = wmpubsub.NewSubscriber(db.Pool, &wmpubsub.SubscriberConfig{Source: open, MaxAttempts: -1})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "wmpubsub: SubscriberConfig.MaxAttempts", "-1 is negative")
}
