package inbox

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// Message is one delivered event, as a Handler sees it.
type Message struct {
	// ID is the event's identity (Oncekit-Event-Id, else Nats-Msg-Id): the
	// dedup key.
	ID uuid.UUID
	// Subject the message was published to.
	Subject string
	// Key is the ordering key (Oncekit-Key header), or empty.
	Key string
	// Payload is the message body.
	Payload []byte
	// Headers holds the first value of each header.
	Headers map[string]string
	// Attempt is the delivery attempt, 1 for the first delivery.
	Attempt int
}

// Handler processes one message inside tx, the transaction that holds the
// message's claim. Everything the handler writes through tx commits together
// with the claim or not at all. The handler must not commit or roll back tx
// (those calls fail with ErrTxOwned); returning an error rolls its work back.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, msg *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, msg *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, msg *Message) error {
	return f(ctx, tx, msg)
}

// Middleware wraps a Handler, for logging, tracing or decoding.
type Middleware func(Handler) Handler

// Chain wraps h with mws; the first middleware is the outermost.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// Delivery is one message as a Source delivers it, with the broker's
// settlement calls. Implementations must be safe to settle from any goroutine.
type Delivery interface {
	// Subject is where the message was published.
	Subject() string
	// Data is the payload.
	Data() []byte
	// Header returns the first value of a header, or "".
	Header(name string) string
	// Headers returns every header.
	Headers() map[string][]string
	// Attempt is the delivery count, 1 for the first delivery.
	Attempt() int
	// Ack tells the broker the message is done.
	Ack(ctx context.Context) error
	// Nak asks the broker to redeliver the message after delay.
	Nak(ctx context.Context, delay time.Duration) error
	// InProgress resets the broker's redelivery timer for the message.
	InProgress(ctx context.Context) error
}

// Source delivers messages at least once, typically a durable consumer of a
// broker (broker/natsjs.Source). A message that is neither acked nor nakked
// is redelivered after the source's ack timeout.
type Source interface {
	// Receive blocks until at least one message is available or ctx ends,
	// then returns up to max messages without waiting for more.
	Receive(ctx context.Context, max int) ([]Delivery, error)
	// Limits reports the redelivery settings the Consumer checks its
	// retention against.
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

// RegisterUUID makes m encode a uuid.UUID (Message.ID) bound to a uuid
// parameter directly, instead of through its driver.Valuer's text form and
// a parse back, which costs pgx several microseconds per value. The wire
// value is the same. The consumer registers it on the connections of the
// transactions it hands to handlers; register it yourself, for example in
// pgxpool.Config.AfterConnect, for connections oncekit does not touch.
// Registering twice is a no-op.
func RegisterUUID(m *pgtype.Map) { pgsql.RegisterUUID(m) }
