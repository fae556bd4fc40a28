package sideeffect

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/tracecontext"
)

// State is the state of a recorded effect.
type State string

// The states of an effect.
const (
	// StatePending: recorded, waiting to be fired (first time or retry).
	StatePending State = "pending"
	// StateFired: a dispatcher committed that it is calling the provider.
	StateFired State = "fired"
	// StateConfirmed: the provider acted; ProviderRef holds its reference.
	StateConfirmed State = "confirmed"
	// StateFailed: the provider certainly did not act (definite error), or
	// an operator resolved the effect as failed. Terminal.
	StateFailed State = "failed"
	// StateUnknown: the outcome cannot be proven; an operator decides.
	StateUnknown State = "unknown"
)

// Valid reports whether s is one of the five states.
func (s State) Valid() bool {
	switch s {
	case StatePending, StateFired, StateConfirmed, StateFailed, StateUnknown:
		return true
	}
	return false
}

// MaxKindLen is the longest effect kind accepted.
const MaxKindLen = 200

// ErrInvalidEffect is returned (wrapped) by Record for an effect without a
// source ID or kind, or with a kind longer than MaxKindLen.
var ErrInvalidEffect = errors.New("sideeffect: invalid effect")

// Effect is one effect a handler decided to cause.
type Effect struct {
	// SourceID identifies what caused the effect, typically the event or
	// domain ID (e.g. the payment ID). Required.
	SourceID string
	// Kind names the effect ("email.receipt", "webhook.order-paid"); it
	// selects the provider. Required.
	Kind string
	// Payload is handed to the provider as is.
	Payload []byte
}

// Recorded is what Record returns.
type Recorded struct {
	// ID is the row's ID, as shown by `oncekit effects list`.
	ID int64
	// Key is the effect's idempotency key, oncekit.DeriveKey(SourceID,
	// Kind), sent with every call to the provider (Call.Key).
	Key string
	// Existing is true when the effect had already been recorded: nothing
	// was written, and ID is the first row's. The first payload is kept.
	Existing bool
}

// Config configures a Ledger. The zero value works.
type Config struct {
	// Schema is the schema oncekit's tables live in. Defaults to oncekit.DefaultSchema.
	Schema string
	// Propagator reads the trace context of Record's ctx, stored with the
	// effect and handed to its provider call. Defaults to tracecontext.W3C.
	Propagator tracecontext.Propagator
}

// ErrInvalidConfig is wrapped by the error New and NewDispatcher return for a
// bad Config or DispatcherConfig; the error's text names the field.
var ErrInvalidConfig = errors.New("sideeffect: invalid config")

// Ledger records effects and holds the operator's actions on them. It is safe
// for concurrent use.
type Ledger struct {
	schema string
	sql    statements
	prop   tracecontext.Propagator
}

// New returns a Ledger for the configured schema. A nil config is the zero
// Config.
func New(cfg *Config) (*Ledger, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Ledger{schema: c.Schema, sql: render(c.Schema), prop: tracecontext.Or(c.Propagator)}, nil
}

// withDefaults returns a copy of c (the zero Config if nil) with defaults set.
func (c *Config) withDefaults() Config {
	out := cfgerr.CopyOf(c)
	out.Schema = cmp.Or(out.Schema, pgsql.DefaultSchema)
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *Config) validate() error {
	if _, err := pgsql.ValidateSchema(c.Schema); err != nil {
		return cfgerr.New(ErrInvalidConfig, "sideeffect: Config.Schema", "%w", err)
	}
	return nil
}

func (e Effect) validate() error {
	switch {
	case e.SourceID == "":
		return fmt.Errorf("%w: empty SourceID", ErrInvalidEffect)
	case e.Kind == "":
		return fmt.Errorf("%w: empty Kind", ErrInvalidEffect)
	case len(e.Kind) > MaxKindLen:
		return fmt.Errorf("%w: Kind longer than %d bytes", ErrInvalidEffect, MaxKindLen)
	}
	return nil
}

// Record inserts eff as pending inside tx, the caller's transaction, so the
// effect exists exactly when the caller's other writes commit. Recording the
// same (SourceID, Kind) again is a no-op that returns the first row with
// Existing set, also when the first record is in a concurrent transaction
// (Record then waits for that transaction; if it rolls back, this one
// inserts). Under REPEATABLE READ or SERIALIZABLE a concurrent first record
// makes PostgreSQL report a serialization failure: retry the transaction.
//
// The trace context of ctx (Config.Propagator) is stored with the effect
// and given to its provider call (Call.Trace).
func (l *Ledger) Record(ctx context.Context, tx pgx.Tx, eff Effect) (Recorded, error) {
	if err := eff.validate(); err != nil {
		return Recorded{}, err
	}
	payload := eff.Payload
	if payload == nil {
		payload = []byte{}
	}
	key := oncekit.DeriveKey(eff.SourceID, eff.Kind)
	var tc any // NULL without a trace context
	if c := l.prop.Inject(ctx); len(c) > 0 {
		b, err := json.Marshal(c)
		if err != nil {
			return Recorded{}, fmt.Errorf("sideeffect: record %s: encode trace: %w", eff.Kind, err)
		}
		tc = string(b)
	}
	var r Recorded
	err := tx.QueryRow(ctx, l.sql.insert, eff.SourceID, eff.Kind, payload, key, tc).Scan(&r.ID, &r.Key)
	if err == nil {
		return r, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Recorded{}, fmt.Errorf("sideeffect: record %s: %w", eff.Kind, err)
	}
	// ON CONFLICT DO NOTHING: the row exists (committed by now, since the
	// insert waited for any concurrent inserter).
	if err := tx.QueryRow(ctx, l.sql.selectBySource, eff.SourceID, eff.Kind).Scan(&r.ID, &r.Key); err != nil {
		return Recorded{}, fmt.Errorf("sideeffect: record %s: read existing: %w", eff.Kind, err)
	}
	r.Existing = true
	return r, nil
}

// Row is a recorded effect as stored.
type Row struct {
	ID       int64
	SourceID string
	Kind     string
	Payload  []byte
	Key      string // the effect's idempotency key
	State    State
	Attempts int
	// NextAttemptAt is when the dispatcher next looks at the row: the due
	// time while pending (and while fired, the due time it was claimed at,
	// or its next try after an indefinite error). Nil once the row is
	// settled, and while it is unknown (only an operator moves it on).
	NextAttemptAt  *time.Time
	LeaseOwner     string
	LeaseExpiresAt *time.Time
	ProviderRef    string
	LastError      string
	ResolvedBy     string
	ResolutionNote string
	ResolvedAt     *time.Time
	CreatedAt      time.Time
	FiredAt        *time.Time
	ConfirmedAt    *time.Time
	UpdatedAt      time.Time
}
