package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/pguuid"
)

// Message is one delivered event, as a Handler sees it: the broker.Message
// as it was published, and the delivery attempt. ID comes from the
// Oncekit-Event-Id header, else Nats-Msg-Id, and is the dedup key; Key comes
// from the Oncekit-Key header (empty when the event has none); Headers holds
// the first value of every header, oncekit's own included.
type Message struct {
	broker.Message
	// Attempt is the delivery attempt, 1 for the first delivery.
	Attempt int
}

// Handler processes one message inside tx, the transaction that holds the
// message's claim. Everything the handler writes through tx commits together
// with the claim or not at all. The handler must not commit or roll back tx
// (those calls fail with ErrTxOwned); returning an error rolls its work back.
// Code that writes through database/sql (sqlc, GORM, Bun, ent) gets tx as a
// *sql.Tx from oncekit.WithSQLTx.
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

// RegisterUUID makes m encode a uuid.UUID (Message.ID) bound to a uuid
// parameter directly, instead of through its driver.Valuer's text form and
// a parse back, which costs pgx several microseconds per value. The wire
// value is the same. The consumer registers it on the connections of the
// transactions it hands to handlers; register it yourself, for example in
// pgxpool.Config.AfterConnect, for connections oncekit does not touch.
// Registering twice is a no-op.
func RegisterUUID(m *pgtype.Map) { pguuid.Register(m) }
