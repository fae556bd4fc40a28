package inbox_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
)

// A copy republished under a new Nats-Msg-Id (to pass the broker's dedup
// window) still carries the event's own ID in Oncekit-Event-Id: that is the
// dedup identity, so the copy is a duplicate.
func TestEventIDWinsOverBrokerMsgID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	event := uuid.New()
	for range 2 {
		rawPublish(t, b.nats.JS, b.subject, map[string]string{
			broker.HeaderEventID: event.String(),
			broker.HeaderMsgID:   uuid.NewString(), // a fresh broker-level ID per copy
		}, []byte("1"))
	}
	cfg := b.config("c")
	cfg.Retention = -1
	c := b.start(b.source("d", 5*time.Second), inbox.HandlerFunc(insertEffect), cfg)
	waitStats(t, c, func(s inbox.Stats) bool { return s.Processed+s.Duplicates == 2 })
	require.Equal(t, inbox.Stats{Processed: 1, Duplicates: 1}, c.Stats())
	require.Equal(t, map[uuid.UUID]int{event: 1}, b.effects())
}
