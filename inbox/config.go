package inbox

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/pgsql"
)

// Config configures a Consumer. Only Name is required.
type Config struct {
	// Name identifies the consumer in processed_messages and dead_letters:
	// two consumers with the same Name share their claims (they are replicas
	// of one consumer), different Names each process every message. Required.
	Name string
	// Schema of oncekit's tables. Defaults to "oncekit".
	Schema string
	// Concurrency is the number of messages (or batches) processed at once,
	// each on its own connection. Defaults to 4.
	Concurrency int
	// BatchSize is the number of messages processed in one transaction. 1
	// processes each message in its own transaction. A batch runs without
	// savepoints; after a handler failure it is rolled back and runs again
	// without the failed message, a SAVEPOINT per message (see the package
	// documentation), at most 64 messages per transaction to stay inside
	// PostgreSQL's subtransaction cache. Defaults to 1. At most 1000. 200
	// suits handlers that only write to PostgreSQL: larger batches spread
	// the commit (and its flush) over more messages. A batch may run past
	// the source's AckWait: the consumer keeps the messages it holds in
	// progress at the broker.
	BatchSize int
	// Ordered processes the messages of one key (Oncekit-Key header) in
	// delivery order, keys hashed onto Concurrency lanes. A failing message is
	// retried in place and holds its lane. Order holds within one consumer
	// process; run one process per durable (or set the source's
	// MaxAckPending to 1) when order must also survive crashes. Defaults to
	// false.
	Ordered bool
	// MaxAttempts is the delivery attempt after whose failure a message is
	// dead-lettered. Defaults to 25.
	MaxAttempts int
	// Backoff returns the delay before redelivering a message whose
	// attempt-th delivery failed. Defaults to ExponentialBackoff(time.Second,
	// 5*time.Minute).
	Backoff func(attempt int) time.Duration
	// Retention is how long claims are kept in processed_messages. It must
	// exceed the source's redelivery horizon (see Horizon), or Run refuses
	// to start. Negative keeps claims forever. Defaults to 7 days.
	Retention time.Duration
	// RetentionInterval is the pause between retention sweeps. Defaults to
	// one minute.
	RetentionInterval time.Duration
	// RetentionBatch bounds the rows one retention DELETE removes. Defaults
	// to 1000.
	RetentionBatch int
	// DisableClaim turns deduplication off: no claim is written or checked
	// and duplicates run the handler again. It exists only to measure what
	// the claim costs (the oncekit-noclaim benchmark); never use it in
	// production. Defaults to false.
	DisableClaim bool
	// Logger receives the consumer's logs, with keys consumer, message_id,
	// subject and attempt. Defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the consumer's metrics (namespace oncekit,
	// subsystem inbox). Nil registers none.
	Registerer prometheus.Registerer
}

// ExponentialBackoff returns a Backoff that waits initial after the first
// failed attempt and doubles each attempt up to max, without jitter (it uses
// cenkalti/backoff's ExponentialBackOff).
func ExponentialBackoff(initial, max time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		b := backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(initial),
			backoff.WithMaxInterval(max),
			backoff.WithMultiplier(2),
			backoff.WithRandomizationFactor(0),
			backoff.WithMaxElapsedTime(0),
		)
		d := initial
		for i := 0; i < attempt && i < 64; i++ {
			d = b.NextBackOff()
			if d >= max {
				return max
			}
		}
		return d
	}
}

// withDefaults fills the zero fields and validates the rest.
func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		return c, fmt.Errorf("%w: Name is required", ErrInvalidConfig)
	}
	schema, err := pgsql.ValidateSchema(c.Schema)
	if err != nil {
		return c, fmt.Errorf("%w: Schema: %w", ErrInvalidConfig, err)
	}
	c.Schema = schema
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Concurrency < 0 {
		return c, fmt.Errorf("%w: Concurrency must be positive", ErrInvalidConfig)
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1
	}
	if c.BatchSize < 0 || c.BatchSize > 1000 {
		return c, fmt.Errorf("%w: BatchSize must be in 1..1000", ErrInvalidConfig)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 25
	}
	if c.MaxAttempts < 0 {
		return c, fmt.Errorf("%w: MaxAttempts must be positive", ErrInvalidConfig)
	}
	if c.Backoff == nil {
		c.Backoff = ExponentialBackoff(time.Second, 5*time.Minute)
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = time.Minute
	}
	if c.RetentionInterval < 0 {
		return c, fmt.Errorf("%w: RetentionInterval must be positive", ErrInvalidConfig)
	}
	if c.RetentionBatch == 0 {
		c.RetentionBatch = 1000
	}
	if c.RetentionBatch < 0 {
		return c, fmt.Errorf("%w: RetentionBatch must be positive", ErrInvalidConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
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
func Horizon(l SourceLimits, maxAttempts int, backoffMax time.Duration) time.Duration {
	deliveries := l.MaxDeliver
	if deliveries <= 0 {
		deliveries = maxAttempts
	}
	h := time.Duration(deliveries) * (l.AckWait + backoffMax)
	return max(h, l.Duplicates)
}
