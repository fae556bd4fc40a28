package aspubsub

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/cfgerr"
)

// HandlerFunc processes a watermill message inside tx, the transaction that
// holds its claim. It must not commit or roll back tx. The messages it
// returns are published after the commit at most once (see the package
// documentation); events that must not be lost belong in the outbox, in tx.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error)

// NoPublishHandlerFunc is a HandlerFunc that produces no messages.
type NoPublishHandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) error

// Config configures an Inbox. Only Name is required.
type Config struct {
	// Name identifies the consumer in processed_messages. Required.
	Name string
	// Schema of oncekit's tables. Defaults to oncekit.DefaultSchema.
	Schema string
	// MessageID returns a message's dedup identity. Defaults to
	// DefaultMessageID.
	MessageID func(*message.Message) (uuid.UUID, error)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the adapter's metrics: the series an
	// inbox.Consumer reports (namespace oncekit, subsystem inbox, label
	// consumer = Name), processed, duplicates, retried (every error handed
	// back to watermill), dead-lettered and handler seconds. Nil means no
	// metrics.
	Registerer prometheus.Registerer
}

// ErrNoMessageID is returned by DefaultMessageID for a message without a
// usable ID.
var ErrNoMessageID = errors.New("aspubsub: message has no valid ID")

// DefaultMessageID takes the Oncekit-Event-Id metadata, else Nats-Msg-Id,
// else the watermill UUID, and requires it to be a non-nil UUID.
func DefaultMessageID(msg *message.Message) (uuid.UUID, error) {
	raw := msg.Metadata.Get(broker.HeaderEventID)
	if raw == "" {
		raw = msg.Metadata.Get(broker.HeaderMsgID)
	}
	if raw == "" {
		raw = msg.UUID
	}
	id, err := uuid.Parse(raw)
	if err != nil || id == uuid.Nil {
		return uuid.Nil, fmt.Errorf("%w: %q", ErrNoMessageID, raw)
	}
	return id, nil
}

// Inbox adapts transaction-taking handlers to watermill handlers.
type Inbox struct {
	db    oncekit.DB
	cfg   Config
	store *inbox.Store
	log   *slog.Logger
	m     *inbox.Metrics

	processed, duplicates, deadLettered, failed atomic.Int64
}

// New returns an Inbox whose handlers run in transactions on db (a
// *pgxpool.Pool).
func New(db oncekit.DB, cfg *Config) (*Inbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is required", inbox.ErrInvalidConfig)
	}
	c := cfgerr.CopyOf(cfg)
	bad := cfgerr.For(inbox.ErrInvalidConfig, "aspubsub: Config")
	if c.Name == "" {
		return nil, bad("Name", "required")
	}
	store, err := inbox.NewStore(c.Schema)
	if err != nil {
		return nil, bad("Schema", "%w", err)
	}
	if c.MessageID == nil {
		c.MessageID = DefaultMessageID
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return &Inbox{db: db, cfg: c, store: store, log: c.Logger.With("consumer", c.Name),
		m: inbox.NewMetrics(c.Registerer, c.Name)}, nil
}

// Stats are an Inbox's counts since it was created.
type Stats struct {
	Processed    int64 // handlers committed
	Duplicates   int64 // acknowledged as duplicates of an existing claim
	DeadLettered int64 // written to dead_letters
	Failed       int64 // returned an error to watermill (redelivered)
}

// Stats returns the counts so far.
func (in *Inbox) Stats() Stats {
	return Stats{in.processed.Load(), in.duplicates.Load(), in.deadLettered.Load(), in.failed.Load()}
}

// NoPublishHandler adapts h to watermill's NoPublishHandlerFunc.
func (in *Inbox) NoPublishHandler(h NoPublishHandlerFunc) message.NoPublishHandlerFunc {
	hf := in.Handler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) ([]*message.Message, error) {
		return nil, h(ctx, tx, msg)
	})
	return func(msg *message.Message) error {
		_, err := hf(msg)
		return err
	}
}

// Handler adapts h to watermill's HandlerFunc with the claim in h's
// transaction.
func (in *Inbox) Handler(h HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		log := in.log.With("watermill_uuid", msg.UUID, "subject", message.SubscribeTopicFromCtx(ctx))
		id, err := in.cfg.MessageID(msg)
		if err != nil {
			return nil, in.deadLetter(ctx, log, msg, "", err.Error(), "invalid_id")
		}
		log = log.With("message_id", id)
		tx, err := in.db.Begin(ctx)
		if err != nil {
			in.fail()
			return nil, fmt.Errorf("aspubsub: begin: %w", err)
		}
		inbox.RegisterUUID(tx.Conn().TypeMap()) // the handler's uuid.UUID arguments, encoded directly
		rollback := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
		claimed, err := in.store.Claim(ctx, tx, in.cfg.Name, id)
		if err != nil {
			rollback()
			in.fail()
			return nil, err
		}
		if !claimed {
			rollback()
			in.m.Duplicate() // series before Stats, which tests wait on
			in.duplicates.Add(1)
			log.Debug("inbox duplicate acknowledged")
			return nil, nil
		}
		start := time.Now()
		out, herr := call(ctx, tx, msg, h)
		in.m.HandlerSeconds(time.Since(start).Seconds())
		if herr != nil {
			rollback()
			if inbox.IsPermanent(herr) {
				return nil, in.deadLetter(ctx, log, msg, id.String(), herr.Error(), "permanent")
			}
			in.fail()
			return nil, herr
		}
		if err := tx.Commit(ctx); err != nil {
			in.fail()
			return nil, fmt.Errorf("aspubsub: commit (the redelivery settles it): %w", err)
		}
		in.m.Processed()
		in.processed.Add(1)
		return out, nil
	}
}

// fail counts an error handed back to watermill, which redelivers.
func (in *Inbox) fail() {
	in.m.Retried()
	in.failed.Add(1)
}

// ownedTx is the handler's view of the transaction: everything but ending it.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return inbox.ErrTxOwned }
func (ownedTx) Rollback(context.Context) error { return inbox.ErrTxOwned }

func call(ctx context.Context, tx pgx.Tx, msg *message.Message, h HandlerFunc) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", inbox.ErrPanic, r)
		}
	}()
	return h(ctx, ownedTx{tx}, msg)
}

// deadLetter writes msg to dead_letters (no claim) and returns nil so that
// watermill acks it, or the write's error so that it is redelivered.
func (in *Inbox) deadLetter(ctx context.Context, log *slog.Logger, msg *message.Message, id, reason, kind string) error {
	headers := make(map[string][]string, len(msg.Metadata))
	for k, v := range msg.Metadata {
		headers[k] = []string{v}
	}
	if id == "" {
		id = msg.Metadata.Get(broker.HeaderEventID)
	}
	rec, refusal, err := in.store.RecordDeadLetter(ctx, in.db, inbox.DeadLetter{
		Consumer: in.cfg.Name, MessageID: id, Subject: message.SubscribeTopicFromCtx(ctx),
		Payload: msg.Payload, Headers: headers, Reason: reason, Attempts: 1,
	})
	if err != nil {
		in.fail()
		return err
	}
	switch rec {
	case inbox.RecordedMinimal:
		log.Warn("inbox dead letter refused by PostgreSQL; recorded a minimal one", "err", refusal)
	case inbox.RecordedNothing:
		// Nothing can be recorded: the message is acked, and this line is
		// its record.
		log.Error("inbox dead letter refused by PostgreSQL, minimal one too; dropping the message", "err", refusal, "reason", reason)
		return nil
	}
	in.m.DeadLettered(kind)
	in.deadLettered.Add(1)
	log.Warn("inbox message dead-lettered", "reason", reason)
	return nil
}
