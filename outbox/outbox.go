package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/pgsql"
)

// Defaults of Config.
const (
	// DefaultMaxPayload is the payload limit unless Config.MaxPayload is set:
	// NATS's default max_payload.
	DefaultMaxPayload = 1 << 20
	// DefaultPartitions is the number of partitions unless configured. The
	// relay must use the same number.
	DefaultPartitions = 16
)

// Config configures an Outbox. The zero value works.
type Config struct {
	// Schema holds oncekit's tables. Defaults to "oncekit".
	Schema string
	// MaxPayload is the largest payload accepted, in bytes. Defaults to
	// DefaultMaxPayload.
	MaxPayload int
	// Partitions is the number of partitions rows are spread over by ordering
	// key. It must equal the relay's RelayConfig.Partitions. Defaults to
	// DefaultPartitions.
	Partitions int
	// Notify makes Enqueue send a NOTIFY (one per transaction) so that a
	// listening relay wakes at once. It costs throughput on the writer side:
	// PostgreSQL serialises the commits of all notifying transactions of the
	// cluster. The relay's adaptive polling keeps latency low without it (see
	// the README for measurements). Defaults to false.
	Notify bool
}

// Outbox writes messages into the outbox table inside the caller's
// transaction. It is safe for concurrent use.
type Outbox struct {
	partitions int
	maxPayload int
	notify     bool
	channel    string
	insertSQL  string
	listSQL    string
	unparkSQL  string
	backlogSQL string
}

// EnqueueResult says what Enqueue did.
type EnqueueResult struct {
	// Inserted is the number of messages written.
	Inserted int
	// Duplicates lists the IDs that were already in the outbox, pending,
	// parked or published and not yet deleted by the relay's retention (or
	// repeated within the call): for them Enqueue was a no-op.
	Duplicates []uuid.UUID
}

// New returns an Outbox for cfg (nil means the zero Config).
func New(cfg *Config) (*Outbox, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	schema, err := pgsql.ValidateSchema(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: Config.Schema: %w", err)
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.MaxPayload < 0 {
		return nil, fmt.Errorf("outbox: Config.MaxPayload: %d is negative", c.MaxPayload)
	}
	if c.Partitions < 0 || c.Partitions > maxPartitions {
		return nil, fmt.Errorf("outbox: Config.Partitions: %d not in 1..%d", c.Partitions, maxPartitions)
	}
	return &Outbox{
		partitions: c.Partitions,
		maxPayload: c.MaxPayload,
		notify:     c.Notify,
		channel:    NotifyChannel(schema),
		insertSQL:  pgsql.Render(insertSQL, schema),
		listSQL:    pgsql.Render(listSQL, schema),
		unparkSQL:  pgsql.Render(unparkSQL, schema),
		backlogSQL: pgsql.Render(backlogSQL, schema),
	}, nil
}

const maxPartitions = 4096

const insertSQL = `
INSERT INTO {schema}.outbox (id, partition, ordering_key, subject, payload, headers)
SELECT m.id, m.partition, m.key, m.subject, m.payload, m.headers::jsonb
FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::bytea[], $6::text[])
	WITH ORDINALITY AS m(id, partition, key, subject, payload, headers, ord)
ORDER BY m.ord
ON CONFLICT (id) DO NOTHING
RETURNING id`

// Enqueue writes msgs into the outbox within tx, in order: messages with the
// same Key are published in the order of their transactions' commits and,
// within one transaction, in the order given. A message whose ID is already
// in the outbox is a no-op reported in EnqueueResult.Duplicates.
//
// Every message is validated before anything is written; the first invalid
// one is reported as an *InvalidMessageError wrapping ErrNilID,
// ErrInvalidSubject, ErrPayloadTooLarge, ErrInvalidHeader or ErrInvalidKey.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...broker.Message) (EnqueueResult, error) {
	if tx == nil {
		return EnqueueResult{}, errors.New("outbox: Enqueue: nil transaction")
	}
	if len(msgs) == 0 {
		return EnqueueResult{}, nil
	}
	ids := make([]uuid.UUID, len(msgs))
	rawIDs := make([][16]byte, len(msgs)) // binary encoding, no text round trip
	parts := make([]int32, len(msgs))
	keys := make([]string, len(msgs))
	subjects := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	headers := make([]*string, len(msgs))
	for i, m := range msgs {
		if err := validate(i, m, o.maxPayload); err != nil {
			return EnqueueResult{}, err
		}
		ids[i], rawIDs[i], keys[i], subjects[i] = m.ID, m.ID, m.Key, m.Subject
		parts[i] = int32(o.Partition(m))
		payloads[i] = m.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		if len(m.Headers) > 0 {
			b, err := json.Marshal(m.Headers)
			if err != nil {
				return EnqueueResult{}, fmt.Errorf("outbox: encode headers: %w", err)
			}
			s := string(b)
			headers[i] = &s
		}
	}
	rows, err := tx.Query(ctx, o.insertSQL, rawIDs, parts, keys, subjects, payloads, headers)
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("outbox: insert: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("outbox: insert: %w", err)
	}
	res := EnqueueResult{Inserted: len(inserted)}
	if len(inserted) < len(msgs) {
		seen := make(map[uuid.UUID]bool, len(inserted))
		for _, id := range inserted {
			seen[id] = true
		}
		for _, id := range ids {
			if seen[id] {
				delete(seen, id) // a repeat within the call is a duplicate too
				continue
			}
			res.Duplicates = append(res.Duplicates, id)
		}
	}
	if o.notify && len(inserted) > 0 {
		// PostgreSQL folds identical notifications of one transaction into one.
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, o.channel); err != nil {
			return res, fmt.Errorf("outbox: notify: %w", err)
		}
	}
	return res, nil
}

// Partition returns the partition m is stored in: a stable hash (FNV-1a) of
// its ordering key, or of its ID when the key is empty, modulo Partitions.
func (o *Outbox) Partition(m broker.Message) int {
	return PartitionOf(m, o.partitions)
}

// PartitionOf returns m's partition among n: a stable hash (FNV-1a, 64 bit)
// of m.Key, or of m.ID's bytes when the key is empty, modulo n.
func PartitionOf(m broker.Message, n int) int {
	h := fnv.New64a()
	if m.Key != "" {
		_, _ = h.Write([]byte(m.Key))
	} else {
		_, _ = h.Write(m.ID[:])
	}
	return int(h.Sum64() % uint64(n))
}

// NotifyChannel is the LISTEN/NOTIFY channel of the outbox in schema.
func NotifyChannel(schema string) string {
	ch := schema + "_outbox"
	if len(ch) > 63 {
		sum := sha256.Sum256([]byte(schema))
		ch = "oncekit_outbox_" + hex.EncodeToString(sum[:8])
	}
	return ch
}
