package outbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/tracecontext"
)

// Defaults of Config.
const (
	// DefaultMaxPayload is the payload limit unless Config.MaxPayload is set:
	// NATS's default max_payload.
	DefaultMaxPayload = 1 << 20
	// DefaultPartitions is the number of partitions the migrations give a
	// new schema. The count is stated once, in the database (outbox_epoch),
	// and changed online by Repartition.
	DefaultPartitions = 16
)

// Config configures an Outbox. The zero value works.
type Config struct {
	// Schema holds oncekit's tables. Defaults to oncekit.DefaultSchema.
	Schema string
	// MaxPayload is the largest payload accepted, in bytes. Defaults to
	// DefaultMaxPayload.
	MaxPayload int
	// Notify makes Enqueue send a NOTIFY (one per transaction) so that a
	// listening relay wakes at once. It costs throughput on the writer side:
	// PostgreSQL serialises the commits of all notifying transactions of the
	// cluster. The relay's adaptive polling keeps latency low without it (see
	// the README for measurements). Defaults to false.
	Notify bool
	// Propagator copies the trace context of Enqueue's ctx into each
	// message's headers (a header the message sets itself is kept).
	// Defaults to tracecontext.W3C.
	Propagator tracecontext.Propagator
	// Logical makes Enqueue write each message into the WAL only
	// (pg_logical_emit_message, transactional), for a LogicalRelay to
	// follow: no row, no index entry, nothing for the relay to mark or
	// retention to delete. Enqueue then reports no Duplicates (it cannot
	// see earlier messages): a message enqueued twice is published twice
	// with one ID, which JetStream's duplicate window and the consumers'
	// claims absorb. It needs wal_level=logical, and the slot set up
	// (SetUpLogical) before the first message: PostgreSQL decodes for a
	// slot only what commits after its creation, so Enqueue refuses
	// (ErrNoSlot) until the slot exists. docs/logical-relay.md has the
	// set-up. Every producer of a schema should use the same mode: the
	// order of one key's messages written one way and the other is not
	// kept.
	Logical bool
	// Slot names the replication slot (and the publication) of Logical.
	// Defaults to "oncekit_" and the schema.
	Slot string
}

// Outbox writes messages into the outbox table inside the caller's
// transaction. It is safe for concurrent use.
type Outbox struct {
	schema     string
	maxPayload int
	notify     bool
	logical    bool
	slot       string
	slotSeen   atomic.Bool // the slot existed at an Enqueue
	prop       tracecontext.Propagator
	channel    string
	sql        outboxSQL
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

// ErrInvalidConfig is wrapped by the error New and NewRelay return for a bad
// Config or RelayConfig; the error's text names the field.
var ErrInvalidConfig = errors.New("outbox: invalid config")

// New returns an Outbox for cfg (nil means the zero Config).
func New(cfg *Config) (*Outbox, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	schema := c.Schema
	return &Outbox{
		schema:     schema,
		maxPayload: c.MaxPayload,
		notify:     c.Notify,
		logical:    c.Logical,
		slot:       c.Slot,
		prop:       tracecontext.Or(c.Propagator),
		channel:    NotifyChannel(schema),
		sql:        renderOutboxSQL(schema),
	}, nil
}

// withDefaults returns a copy of c (the zero Config if nil) with defaults set.
func (c *Config) withDefaults() Config {
	out := cfgerr.CopyOf(c)
	out.Schema = cmp.Or(out.Schema, pgsql.DefaultSchema)
	out.MaxPayload = cmp.Or(out.MaxPayload, DefaultMaxPayload)
	out.Slot = cmp.Or(out.Slot, "oncekit_"+out.Schema)
	return out
}

// validate returns an error naming the first bad field, wrapping
// ErrInvalidConfig.
func (c *Config) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "outbox: Config")
	if _, err := pgsql.ValidateSchema(c.Schema); err != nil {
		return bad("Schema", "%w", err)
	}
	if len(c.Slot) > 63 || strings.Trim(c.Slot, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		return bad("Slot", "%q: at most 63 lower-case letters, digits and underscores", c.Slot)
	}
	return bad.IfNegative(c, "MaxPayload")
}

// Enqueue writes msgs into the outbox within tx, in order: messages with the
// same Key are published in the order of their transactions' commits and,
// within one transaction, in the order given. A message whose ID is already
// in the outbox is a no-op reported in EnqueueResult.Duplicates (not with
// Config.Logical, which writes msgs into the WAL instead of the table).
//
// The trace context of ctx (Config.Propagator) is added to each message's
// headers, except headers the message sets itself.
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
	if o.logical {
		return o.enqueueWAL(ctx, tx, msgs)
	}
	ids := make([]uuid.UUID, len(msgs))
	rawIDs := make([]pgtype.UUID, len(msgs)) // binary encoding in every query execution mode
	hashes := make([]int64, len(msgs))
	keys := make([]string, len(msgs))
	subjects := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	headers := make([]*string, len(msgs))
	tc := o.prop.Inject(ctx)
	for i, m := range msgs {
		if err := validate(i, m, o.maxPayload); err != nil {
			return EnqueueResult{}, err
		}
		if len(tc) > 0 {
			m.Headers = withTrace(m.Headers, tc)
		}
		ids[i], rawIDs[i], keys[i], subjects[i] = m.ID, pgsql.UUID(m.ID), m.Key, m.Subject
		hashes[i] = int64(partitionHash(m)) // its bits: the INSERT takes it modulo the count
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
	rows, err := tx.Query(ctx, o.sql.insert, rawIDs, hashes, keys, subjects, payloads, headers)
	if err != nil {
		return EnqueueResult{}, insertError(err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return EnqueueResult{}, insertError(err)
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
		if _, err := tx.Exec(ctx, o.sql.notify, o.channel); err != nil {
			return res, fmt.Errorf("outbox: notify: %w", err)
		}
	}
	return res, nil
}

// ErrNoEpoch is returned by Enqueue when outbox_epoch, where the partition
// count is stated, has no row: the migrations were not run to 023, or the
// row was deleted. Nothing is written.
var ErrNoEpoch = errors.New("outbox: outbox_epoch has no row: run the migrations")

// insertError is the error of Enqueue's INSERT: ErrNoEpoch for a partition
// or epoch left NULL by a missing outbox_epoch row.
func insertError(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23502" && (pg.ColumnName == "partition" || pg.ColumnName == "epoch") {
		return fmt.Errorf("%w (%s)", ErrNoEpoch, pg.Message)
	}
	return fmt.Errorf("outbox: insert: %w", err)
}

// withTrace returns h plus the headers of tc that h does not set (in any
// letter case) and that are valid message headers; h is not modified.
func withTrace(h map[string]string, tc tracecontext.Carrier) map[string]string {
	out := make(map[string]string, len(h)+len(tc))
	for k, v := range h {
		out[k] = v
	}
	for k, v := range tc {
		if !isToken(k) || reserved[strings.ToLower(k)] || strings.ContainsAny(v, "\r\n\x00") {
			continue // a propagator's header that cannot travel is dropped
		}
		set := false
		for hk := range h {
			if strings.EqualFold(hk, k) {
				set = true
				break
			}
		}
		if !set {
			out[k] = v
		}
	}
	return out
}

// PartitionCount returns the partition count writers use now
// (outbox_epoch, which the migrations fill and Repartition changes), read
// from q on every call: for a caller that sizes a relay's pool before it
// starts.
func (o *Outbox) PartitionCount(ctx context.Context, q oncekit.Querier) (int, error) {
	var n int32
	if err := q.QueryRow(ctx, o.sql.partitions).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: read the partition count: %w", err)
	}
	return int(n), nil
}

// partitionOf returns m's partition among n: partitionHash modulo n. The
// INSERT computes the same (partitionExpr) with the count it reads.
func partitionOf(m broker.Message, n int) int {
	return int(partitionHash(m) % uint64(n))
}

// partitionHash is a stable hash (FNV-1a, 64 bit) of m.Key, or of m.ID's
// bytes when the key is empty.
func partitionHash(m broker.Message) uint64 {
	h := fnv.New64a()
	if m.Key != "" {
		_, _ = h.Write([]byte(m.Key))
	} else {
		_, _ = h.Write(m.ID[:])
	}
	return h.Sum64()
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
