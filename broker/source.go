package broker

import (
	"context"
	"errors"
	"time"
)

// ErrSourceClosed is returned by a Source's Receive once the source is
// closed; an inbox.Consumer's Run then stops and returns it.
var ErrSourceClosed = errors.New("broker: source closed")

// Delivery is one message as a Source delivers it, with the broker's
// settlement calls.
//
// A delivery is settled at most once, by Ack or by Nak; InProgress may be
// called any number of times before that. A delivery that is never settled
// (the process died, or the source was closed first) is delivered again by
// the broker after its ack timeout: that redelivery is what makes a Source
// at-least-once. Implementations must be safe to use from any goroutine.
type Delivery interface {
	// Subject is where the message was published (the topic, stream or
	// queue name on brokers without subjects).
	Subject() string
	// Data is the payload.
	Data() []byte
	// Header returns the first value of a header, or "".
	Header(name string) string
	// Headers returns every header. The oncekit headers (HeaderEventID,
	// HeaderKey) published with the message come back here unchanged.
	Headers() map[string][]string
	// Attempt is the delivery count, 1 for the first delivery. A broker
	// that does not count deliveries reports 1, and the consumer counts
	// its own failed attempts.
	Attempt() int
	// Ack tells the broker the message is done: it is not delivered again
	// (except as a new copy published under the same event ID, which the
	// consumer's claim absorbs). The consumer acks only after its
	// transaction committed.
	Ack(ctx context.Context) error
	// Nak asks the broker to deliver the message again after delay (at once
	// when delay is 0). A broker without delayed redelivery waits delay
	// before handing the message back, so the delay is a lower bound.
	Nak(ctx context.Context, delay time.Duration) error
	// InProgress resets the broker's redelivery timer for the message, so a
	// long transaction is not raced by a redelivered copy. Brokers without
	// such a timer (redelivery only on disconnect) return nil.
	InProgress(ctx context.Context) error
}

// Terminator is a Delivery the broker can be told never to deliver again,
// whatever its redelivery settings (JetStream's Term). The inbox terminates
// a message it cannot settle otherwise: PostgreSQL refused even a minimal
// dead letter for it. A Delivery without Term is acked instead.
type Terminator interface {
	// Term settles the delivery for good; reason says why, where the
	// broker records one (JetStream's advisory of a terminated message).
	Term(ctx context.Context, reason string) error
}

// Source delivers messages at least once: typically a durable consumer of a
// broker (broker/natsjs.Source, watermill/asbroker.Source).
//
// Every message published to what the source reads is delivered until it
// is acked; a message neither acked nor nakked is delivered again after the
// source's ack timeout (Limits.AckWait) or once the process that held it is
// gone. Copies are possible (a redelivery, a republished event), never
// losses: the inbox's claim on the event ID is the dedup.
type Source interface {
	// Receive blocks until at least one message is available or ctx ends,
	// then returns up to max messages without waiting for more. A source
	// may hand out a message only once earlier ones are settled (a
	// watermill subscription does), so a caller must never wait for a full
	// batch before settling. After the source is closed it returns
	// ErrSourceClosed.
	Receive(ctx context.Context, max int) ([]Delivery, error)
	// Limits reports the redelivery settings the inbox checks the
	// retention of its claims against.
	Limits(ctx context.Context) (SourceLimits, error)
}

// SourceLimits are a source's redelivery settings.
type SourceLimits struct {
	// AckWait is how long the broker waits for an ack before redelivering.
	AckWait time.Duration
	// MaxDeliver bounds deliveries per message; 0 or less is unlimited.
	MaxDeliver int
	// Duplicates is the broker's publish dedup window (0 if none): a copy
	// published within it is dropped by the broker itself.
	Duplicates time.Duration
}

// OrderedSource is a Source whose messages have a position in one log (a
// JetStream stream sequence) and that can say which of them are settled.
// The inbox's ordered mode (inbox.Config.Ordered) needs it to keep a key's order across
// processes and crashes: before a message runs, the consumer looks at every
// earlier message of the source that the broker may still redeliver (above
// the ack floor), and holds the message back while one of them has its key
// and has not taken effect. natsjs.Source implements it.
type OrderedSource interface {
	Source
	// AckFloor returns a sequence at or below which every message of the
	// source has been acknowledged. A stale (lower) answer is allowed.
	AckFloor(ctx context.Context) (uint64, error)
	// Scan returns the headers of the source's messages with a sequence
	// from from up to at least to, in sequence order; messages no longer
	// in the log are skipped. It may return messages past to. Calls are
	// not concurrent, and each usually starts where the last one ended.
	// With to below from it only checks that the log can be read from
	// from: the consumer calls it so at start, and refuses to run without.
	// A return that does not reach to is taken as a failed read (the
	// consumer holds and reads again): it may stop short only at the log's
	// certain end, never on the word of a replica that may lag the log.
	Scan(ctx context.Context, from, to uint64) ([]Scanned, error)
}

// Scanned is one message as OrderedSource.Scan reads it: its position and
// its headers (the payload is not needed).
type Scanned struct {
	Sequence uint64              // the message's position in the log
	Headers  map[string][]string // the message's headers
}

// SequencedDelivery is a Delivery that knows its position in the log. The
// deliveries of an OrderedSource implement it.
type SequencedDelivery interface {
	Delivery
	// Sequence returns the message's position in the log (a redelivery
	// has the same one) and the delivery's among every delivery of the
	// source, first or not, to any process of the durable (0 if unknown).
	// Ordered mode does not rely on the latter: after a consumer leader
	// change JetStream may number deliveries again.
	Sequence() (msg, delivery uint64)
}
