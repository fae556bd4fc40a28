package aspubsub_test

import (
	"context"
	"testing"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/cfgerr/cfgerrtest"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/watermill/aspubsub"
)

// A bad config is refused with an error naming the field, wrapping
// inbox.ErrInvalidConfig.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := aspubsub.New(db.Pool, &aspubsub.Config{})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "aspubsub: Config.Name", "required")
	_, err = aspubsub.New(db.Pool, &aspubsub.Config{Name: "n", Schema: "no such-schema"})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "aspubsub: Config.Schema", "")

	open := func(context.Context, string, string) (broker.Source, func(), error) { return nil, func() {}, nil }
	_, err = aspubsub.NewSubscriber(db.Pool, &aspubsub.SubscriberConfig{})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "aspubsub: SubscriberConfig.Source", "required")
	_, err = aspubsub.NewSubscriber(db.Pool, &aspubsub.SubscriberConfig{Source: open, MaxAttempts: -1})
	cfgerrtest.RequireField(t, err, inbox.ErrInvalidConfig, "aspubsub: SubscriberConfig.MaxAttempts", "-1 is negative")
}
