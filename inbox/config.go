package inbox

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/oncekit/oncekit/broker"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/backoff"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/retention"
	"github.com/oncekit/oncekit/tracecontext"
)

// Config configures a Consumer. Only Name is required.
type Config struct {
	// Name identifies the consumer in processed_messages and dead_letters:
	// two consumers with the same Name share their claims (they are replicas
	// of one consumer), different Names each process every message. Valid
	// UTF-8 without control characters, at most 255 bytes. Required.
	Name string
	// Schema of oncekit's tables. Defaults to oncekit.DefaultSchema.
	Schema string
	// Concurrency is the number of messages (or batches) processed at once,
	// each on its own connection. Defaults to 4.
	Concurrency int
	// BatchSize is the most messages processed in one transaction: a batch
	// takes what has arrived, up to BatchSize, and never waits for more, so
	// a larger BatchSize costs a quiet consumer nothing and lets a busy one
	// keep up (docs/decisions/027). 1 processes each message in its own
	// transaction. A batch runs without savepoints; after a handler failure
	// it is rolled back and runs again without the failed message, a
	// SAVEPOINT per message (see the package documentation), at most 64
	// messages per transaction to stay inside PostgreSQL's subtransaction
	// cache. Defaults to 1. At most 1000. 100 to 200 suit handlers that
	// only write to PostgreSQL: larger batches spread the commit (and its
	// flush) over more messages. A batch may run past the source's AckWait:
	// the consumer keeps the messages it holds in progress at the broker.
	BatchSize int
	// Ordered applies the messages of one key (Oncekit-Key header) in the
	// order of the source's log (the JetStream stream sequence), keys in
	// parallel on Concurrency lanes, across crashes, restarts and any number
	// of processes of one durable. Before a message runs, the consumer
	// checks that no earlier message of its key above the durable's ack
	// floor is still unsettled (not claimed, not dead-lettered), wherever
	// it was delivered; if one is, the message is held back, kept in
	// progress, without spending a delivery attempt. A message another
	// process held when it died thus holds its key (only its key) until the
	// broker redelivers it, after the source's AckWait. A failing message
	// is retried in place and holds its lane. A copy of an event already
	// applied, and a dead-lettered message, do not hold their key. The
	// source must be an OrderedSource (broker/natsjs.Source is), or
	// NewConsumer returns ErrOrderUnsupported; so does Run if it cannot
	// read the log (a work-queue stream). Order holds across a change of
	// the durable's leader too: the consumer infers nothing from delivery
	// numbering, and holds while it cannot read the log. One process costs
	// nothing measurable (a durable filtered to some of a stream's subjects
	// also reads the headers between its messages); several processes of one durable read the headers of each
	// other's messages and wait for each other's commits on shared keys
	// (0.61 of the rate without the check, for two); docs/ordering.md has
	// the figures. Defaults to false.
	Ordered bool
	// MaxAttempts is the delivery attempt after whose failure a message is
	// dead-lettered. Attempts are the broker's delivery count, so crashes
	// and restarts that redeliver a message count too. A failure that is
	// PostgreSQL's rather than the message's (a lost or refused connection,
	// a server shutting down or starting, too many connections, a
	// serialization failure or deadlock) is not dead-lettered: the message
	// is retried until it succeeds or fails on its own account, or until
	// the source's last delivery (a finite MaxDeliver), where a dead letter
	// keeps what the broker would otherwise drop. Defaults to 25.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the delay before a message whose
	// delivery failed is delivered again: MinBackoff after the first
	// failure, doubling with each, at most MaxBackoff. Default to 1s and
	// 5m.
	MinBackoff, MaxBackoff time.Duration
	// Retention is how long claims are kept in processed_messages. It must
	// exceed the source's redelivery horizon (see Horizon), or Run refuses
	// to start. Negative keeps claims forever. Defaults to 7 days.
	Retention time.Duration
	// RetentionInterval is the period of the retention loop. Defaults to
	// oncekit.DefaultRetentionInterval.
	RetentionInterval time.Duration
	// RetentionBatch is the most rows one retention DELETE removes.
	// Defaults to oncekit.DefaultRetentionBatch.
	RetentionBatch int
	// RetentionRate is the most rows a retention pass deletes per second
	// (negative: no limit). Defaults to oncekit.DefaultRetentionRate.
	RetentionRate int
	// DeadLetterRetention is how long the consumer's dead letters are kept
	// once replayed (counted from the replay); the retention sweep deletes
	// older ones, RetentionBatch rows per statement. Dead letters not yet
	// replayed are never deleted by it: they wait for `oncekit dlq replay`
	// or `dlq prune`. Negative keeps replayed ones forever. Defaults to 7
	// days.
	DeadLetterRetention time.Duration
	// Logger receives the consumer's logs, with keys consumer, message_id,
	// subject and attempt. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the consumer's metrics (namespace oncekit,
	// subsystem inbox). Nil registers none.
	Registerer prometheus.Registerer
	// Propagator puts each delivery's trace context (its traceparent and
	// tracestate headers) into the context its handler call gets, in batch
	// mode too. Defaults to tracecontext.W3C.
	Propagator tracecontext.Propagator
	// Verifier, when set, authenticates every message before its claim
	// (eventsig.Verifier checks the relay's Ed25519 signatures): a message
	// it refuses is dead-lettered with reason "unauthenticated: …" and no
	// claim, so a forged message under a genuine event's ID does not keep
	// the genuine event out. Defaults to nil: messages are not
	// authenticated.
	Verifier Verifier
	// Test switches guarantees off, for benchmarks that price them and
	// for checkers shown to catch their absence. Never set in production.
	Test TestConfig
}

// TestConfig holds the switches that break the consumer on purpose. The
// zero value breaks nothing.
type TestConfig struct {
	// DisableClaim turns deduplication off: no claim is written or checked
	// and duplicates run the handler again. It prices the claim (the
	// oncekit-noclaim benchmark).
	DisableClaim bool
	// DisableOrderGate keeps Ordered's lanes but turns off their check
	// against the messages other processes (or this one before a restart)
	// hold: order then holds only within one process and breaks after a
	// crash. It prices the check (the ungated runs of
	// BenchmarkConsumeOrdered).
	DisableOrderGate bool
}

// Verifier authenticates a message; an error means it is not to be
// trusted. eventsig.Verifier is one.
type Verifier interface {
	Verify(msg *broker.Message) error
}

// backoff is the delay before the delivery after a failed attempt-th one:
// MinBackoff doubled attempt-1 times, at most MaxBackoff, without jitter.
func (c *Config) backoff(attempt int) time.Duration {
	return backoff.Policy{Min: c.MinBackoff, Max: c.MaxBackoff}.Delay(attempt)
}

// withDefaults returns a copy of c (the zero Config if nil) with defaults
// set.
func (c *Config) withDefaults() Config {
	out := cfgerr.CopyOf(c)
	out.Schema = cmp.Or(out.Schema, pgsql.DefaultSchema)
	out.Concurrency = cmp.Or(out.Concurrency, 4)
	out.BatchSize = cmp.Or(out.BatchSize, 1)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, 25)
	out.MinBackoff = cmp.Or(out.MinBackoff, time.Second)
	out.MaxBackoff = cmp.Or(out.MaxBackoff, max(5*time.Minute, out.MinBackoff))
	out.Retention = cmp.Or(out.Retention, 7*24*time.Hour)
	retention.Defaults(&out.RetentionInterval, &out.RetentionBatch, &out.RetentionRate)
	out.DeadLetterRetention = cmp.Or(out.DeadLetterRetention, 7*24*time.Hour)
	out.Logger = cmp.Or(out.Logger, slog.Default())
	out.Propagator = tracecontext.Or(out.Propagator)
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *Config) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "inbox: Config")
	if c.Name == "" {
		return bad("Name", "required")
	}
	if err := bad.IfNotID(c, "Name"); err != nil {
		return err
	}
	if _, err := pgsql.ValidateSchema(c.Schema); err != nil {
		return bad("Schema", "%w", err)
	}
	if c.BatchSize < 1 || c.BatchSize > 1000 {
		return bad("BatchSize", "%d not in 1..1000", c.BatchSize)
	}
	if c.MinBackoff > c.MaxBackoff {
		return bad("MinBackoff", "%v is above MaxBackoff (%v)", c.MinBackoff, c.MaxBackoff)
	}
	return bad.IfNegative(c, "Concurrency", "MaxAttempts", "MinBackoff", "RetentionInterval", "RetentionBatch")
}

// Horizon is how long after a message was processed a copy of it can still
// arrive through the broker, and so how long its claim must be kept:
//
//	max(Duplicates, deliveries × (AckWait + backoffMax))
//
// where deliveries is the source's MaxDeliver, or maxAttempts when the source
// redelivers without limit (the consumer dead-letters at maxAttempts), and
// backoffMax is the longest redelivery delay the consumer asks for. The first
// term covers a producer re-publishing within the broker's dedup window (the
// broker drops those copies itself, but a claim older than the window is
// harmless to keep); the second covers redeliveries of a message whose ack
// was lost. A producer that re-publishes an event later than both (an outbox
// replayed by hand after days) is covered only by a longer Retention.
func Horizon(l broker.SourceLimits, maxAttempts int, backoffMax time.Duration) time.Duration {
	deliveries := l.MaxDeliver
	if deliveries <= 0 {
		deliveries = maxAttempts
	}
	h := time.Duration(deliveries) * (l.AckWait + backoffMax)
	return max(h, l.Duplicates)
}
