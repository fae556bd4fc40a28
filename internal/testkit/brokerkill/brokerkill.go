// Package brokerkill runs outbox → relay → broker → inbox with the relay
// and consumer processes SIGKILLed at random moments and consumers joining
// and leaving the group (a rebalance in the middle of their batches), then
// checks the history in PostgreSQL: every event applied once, in its key's
// order. It knows no broker: a broker plugs in with a Broker, its two
// constructors, which the helper processes call.
//
// The test process enqueues the events and supervises; the relays and the
// consumers are helper processes (the test binary, re-executed), so a kill
// is a real SIGKILL, with no deferred call and no graceful close. The broker
// must outlive them (an in-process fake in the test process, or a server).
package brokerkill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/outbox"
)

// Broker is what a run needs of a broker: a publisher for a relay process
// and a source (one more member of the consumer group) for a consumer
// process, both on Subject. Each returns its closer.
type Broker struct {
	// Name labels the summary line.
	Name string
	// Subject is what the events are enqueued to.
	Subject      string
	NewPublisher func(ctx context.Context) (broker.Publisher, func(), error)
	NewSource    func(ctx context.Context) (broker.Source, func(), error)
	// Stored, if set, counts the messages the broker holds on Subject once
	// the run is over: beyond Events, the copies a killed relay published
	// again, which the inbox absorbed.
	Stored func(ctx context.Context) (int, error)
	// Idle, if set, reports whether the broker holds nothing more for the
	// consumers on Subject (for a queue: no message visible, in flight or
	// delayed). The run then also waits for it before counting, so that
	// every copy a killed relay published or a killed consumer left unacked
	// has reached a consumer, and a duplicate applied is counted.
	Idle func(ctx context.Context) (bool, error)
	// Unordered is a broker that keeps no key's order (an SQS standard
	// queue): the run counts and reports order violations, and they do not
	// fail it.
	Unordered bool
}

// The environment of a helper process.
const (
	EnvRole   = "BROKERKILL_ROLE" // "relay" or "consumer"
	EnvDB     = "BROKERKILL_DB_URL"
	EnvSchema = "BROKERKILL_SCHEMA"
)

// Effects is the table the consumers' handler writes, one row per
// processing of an event, in the run's schema.
const Effects = "brokerkill_effects"

// Role returns the helper role this process was started for, "" in the
// test process itself.
func Role() string { return os.Getenv(EnvRole) }

var quiet = slog.New(slog.DiscardHandler)

// RelayConfig is the relays' configuration: a short lease, so that a
// killed relay's partitions move within seconds.
func RelayConfig() *outbox.RelayConfig {
	return &outbox.RelayConfig{Lease: 2 * time.Second, PollInterval: 50 * time.Millisecond,
		PublishTimeout: 5 * time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Logger: quiet}
}

// Helper runs the role of this helper process (Role) until it is killed or
// ctx ends: a relay publishing the run's outbox, or a consumer applying it.
// SIGTERM stops it gracefully (a consumer leaves its group).
func Helper(ctx context.Context, b Broker) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(EnvDB))
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := os.Getenv(EnvSchema)
	switch role := Role(); role {
	case "relay":
		pub, closePub, err := b.NewPublisher(ctx)
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		defer closePub()
		ob, err := outbox.New(&outbox.Config{Schema: schema})
		if err != nil {
			return err
		}
		r, err := outbox.NewRelay(pool, ob, pub, RelayConfig())
		if err != nil {
			return err
		}
		return r.Run(ctx)
	case "consumer":
		src, closeSrc, err := b.NewSource(ctx)
		if err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
		defer closeSrc()
		c, err := inbox.NewConsumer(pool, src, inbox.HandlerFunc(apply),
			&inbox.Config{Name: "brokerkill", Schema: schema, BatchSize: 16, Logger: quiet})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	default:
		return fmt.Errorf("brokerkill: unknown role %q", role)
	}
}

// apply is the consumers' handler: one row per processing, with the
// event's key and its place in the key's sequence (the payload).
func apply(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
	seq, err := strconv.Atoi(string(msg.Payload))
	if err != nil {
		return fmt.Errorf("payload %q: %w", msg.Payload, err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+Effects+` (event_id, key, seq) VALUES ($1, $2, $3)`, msg.ID, msg.Key, seq)
	return err
}

// Summary is what a run did and found.
type Summary struct {
	Broker string
	Events int
	// RelayKills and ConsumerKills are the SIGKILLs, AtCrashPoints those
	// a helper sent itself at its armed crash point.
	RelayKills, ConsumerKills, AtCrashPoints int
	// Joins and Leaves are consumers that joined the group, and left it
	// gracefully, while the others were mid-batch: each a rebalance.
	Joins, Leaves int
	// Lost: events never applied. Duplicates: applications beyond the
	// first. OrderViolations: applications of a key's event after a later
	// one of the same key. All three must be 0, OrderViolations only on a
	// broker that keeps a key's order.
	Lost, Duplicates, OrderViolations int
	// Unordered is Broker.Unordered: OrderViolations is reported, not
	// checked.
	Unordered bool
	// Stored is what Broker.Stored counted (-1 without it): the copies
	// beyond Events reached the consumers and were dropped by the inbox's
	// claim.
	Stored int
	// Drain is the time from the last disruption to every event applied.
	Elapsed, Drain time.Duration
}

// String is the machine-readable summary line; order_checked=false ends
// it on an unordered broker.
func (s Summary) String() string {
	line := fmt.Sprintf("brokerkill broker=%s events=%d kills=%d relay_kills=%d consumer_kills=%d at_crash_points=%d joins=%d leaves=%d stored=%d lost=%d duplicates_applied=%d order_violations=%d drain=%s elapsed=%s",
		s.Broker, s.Events, s.RelayKills+s.ConsumerKills, s.RelayKills, s.ConsumerKills, s.AtCrashPoints, s.Joins, s.Leaves,
		s.Stored, s.Lost, s.Duplicates, s.OrderViolations, s.Drain.Round(time.Millisecond), s.Elapsed.Round(time.Millisecond))
	if s.Unordered {
		line += " order_checked=false"
	}
	return line
}

// Failed says what is wrong with the run's outcome, nil when nothing.
func (s Summary) Failed() error {
	if s.Lost != 0 || s.Duplicates != 0 || (s.OrderViolations != 0 && !s.Unordered) {
		return errors.New("brokerkill: " + s.String())
	}
	return nil
}

// check counts the run's outcome from the effects table.
func check(ctx context.Context, pool *pgxpool.Pool, events int) (lost, dups, order int, err error) {
	var total, distinct int
	if err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+Effects).Scan(&total, &distinct); err != nil {
		return 0, 0, 0, err
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY key ORDER BY id) AS prev FROM `+
		Effects+`) s WHERE prev >= seq`).Scan(&order)
	return events - distinct, total - distinct, order, err
}
