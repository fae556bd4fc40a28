package broker

import (
	"context"
	"errors"
)

// ErrEndOfWindow is returned by a Window's Receive once it has delivered
// every message of the window.
var ErrEndOfWindow = errors.New("broker: end of window")

// Window delivers a bounded stretch of a log once, in log order, apart from
// the durable consumers that settle the log's messages: reading it moves no
// durable's position and redelivers nothing to anyone. The inbox replays a
// window through a consumer's handler (inbox.Consumer.ReplayWindow) to apply
// again what a database failover erased after the broker was acked.
// natsjs.Window is one.
//
// Receive blocks until at least one message of the window is available or
// ctx ends, then returns up to max messages without waiting for more; after
// the window's last message it returns ErrEndOfWindow, and it never waits
// for a message published after the window was opened. Settling a
// delivery of a window (Ack, Nak, InProgress, Term) changes nothing at the
// broker: the reader retries a failed message itself.
type Window interface {
	Receive(ctx context.Context, max int) ([]Delivery, error)
	// Last returns the position in the log the window ends at: no message
	// past it is delivered.
	Last() uint64
}
