package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/cfgerr"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/wait"
)

// LogicalRelayConfig configures a LogicalRelay. The zero value works.
type LogicalRelayConfig struct {
	// BatchSize is the most messages published at once. Defaults to 1000.
	BatchSize int
	// PublishTimeout bounds one publish round. Defaults to 30s.
	PublishTimeout time.Duration
	// StatusInterval is the longest time between two reports of the
	// confirmed position to PostgreSQL, and the period of the slot lag
	// gauge and the lease check. Defaults to 10s.
	StatusInterval time.Duration
	// MaxAttempts is the number of failed publishes after which a message
	// is parked (written to the outbox table, parked, with its key's later
	// messages behind it), so that it holds up nothing else. Attempts are
	// counted only while the broker is connected (an outage parks
	// nothing; a stream's leader election, which fails publishes on a live
	// connection, counts, hence the room the defaults leave it: about 40 s
	// of failures before a message parks). Defaults to 10.
	MaxAttempts int
	// MinBackoff and MaxBackoff bound the wait before a failed round is
	// tried again: everything after the failure waits with it (the relay
	// publishes in commit order). Default to 500ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// Table configures the polling Relay the LogicalRelay runs for the
	// outbox table: parked messages once unparked, and rows enqueued
	// without Config.Logical (before a switch). Its Registerer is its own.
	// Its PollInterval defaults to 5s, not 500ms: the table is looked at
	// at once when a message is unparked (Unpark notifies) or written
	// into it by this relay, so the idle relay need not poll it often.
	Table RelayConfig
	// Standby reaches a standby that a failover may promote (PostgreSQL
	// 17, sync_replication_slots), with the privileges to read
	// pg_replication_slots: every StatusInterval the relay reads the
	// standby's copy of its slot into the gauges
	// oncekit_outbox_logical_standby_slot_ready and
	// oncekit_outbox_logical_standby_slot_lag_bytes (StandbySlotStatus).
	// Nil: the relay reads no standby and has neither gauge.
	Standby oncekit.Querier
	// StandbyMaxLag is the most bytes the standby's copy of the slot may
	// be behind the primary's and be ready: a failover publishes again what
	// the copy had not confirmed, and past the broker's duplicate window
	// consumers see it twice. Defaults to 16 MiB.
	StandbyMaxLag int64
	// ReplicationURL is a connection string for the relay's replication
	// stream and its lease, which need a session of their own on the server
	// itself: give it when the pool goes through a connection pooler
	// (PgBouncer, Supavisor), with the address of the server behind it. It
	// must reach the pool's database: Run returns a *DatabaseMismatchError
	// when it does not. Defaults to the connection settings of the pool's
	// own connections.
	ReplicationURL string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics. Nil means no metrics.
	Registerer prometheus.Registerer
}

func (c *LogicalRelayConfig) withDefaults() LogicalRelayConfig {
	out := cfgerr.CopyOf(c)
	out.BatchSize = cmp.Or(out.BatchSize, 1000)
	out.PublishTimeout = cmp.Or(out.PublishTimeout, 30*time.Second)
	out.StatusInterval = cmp.Or(out.StatusInterval, 10*time.Second)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, 10)
	out.MinBackoff = cmp.Or(out.MinBackoff, 500*time.Millisecond)
	out.MaxBackoff = cmp.Or(out.MaxBackoff, 5*time.Second)
	out.StandbyMaxLag = cmp.Or(out.StandbyMaxLag, 16<<20)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Table.Logger == nil {
		out.Table.Logger = out.Logger
	}
	out.Table.PollInterval = cmp.Or(out.Table.PollInterval, 5*time.Second)
	return out
}

func (c *LogicalRelayConfig) validate() error {
	bad := cfgerr.For(ErrInvalidConfig, "outbox: LogicalRelayConfig")
	if err := bad.IfNegative(c, "BatchSize", "PublishTimeout", "StatusInterval", "MaxAttempts", "MinBackoff", "MaxBackoff", "StandbyMaxLag"); err != nil {
		return err
	}
	if c.MinBackoff > c.MaxBackoff {
		return bad("MinBackoff", "%v is above MaxBackoff (%v)", c.MinBackoff, c.MaxBackoff)
	}
	if c.ReplicationURL != "" {
		if _, err := parseDirect(c.ReplicationURL); err != nil {
			return bad("ReplicationURL", "%v", err)
		}
	}
	return nil
}

// LogicalRelay publishes the messages an Outbox with Config.Logical writes
// into the WAL, following PostgreSQL's logical decoding (pgoutput) through
// a replication slot: no query of the outbox, no row per message. Messages
// reach the broker in commit order (so each key's in order), and the
// slot's position is confirmed only past transactions every message of
// which the broker acknowledged: after a crash PostgreSQL sends again what
// was not confirmed, and the broker's deduplication (Nats-Msg-Id) absorbs
// what had gone out. One relay streams at a time: it holds a lease (an
// advisory lock, on a direct connection of its own) that a standby waits
// for. docs/logical-relay.md has the set-up (wal_level=logical, PostgreSQL
// 14 or later, a connection string that reaches the server directly).
type LogicalRelay struct {
	pool oncekit.Pool
	repl *pgx.ConnConfig // LogicalRelayConfig.ReplicationURL's; nil: the pool's
	ob   *Outbox
	pub  broker.Publisher
	cfg  LogicalRelayConfig
	log  *slog.Logger
	m    *logicalMetrics
	sql  logicalSQL
	tbl  *Relay

	running sync.Mutex
	// known is the highest position the relay knows its slot confirmed
	// within the lease it holds (0 outside one): the slot's own moving
	// past it means another slot took its name (see slotLost).
	known atomic.Uint64
	// record is where the relay last recorded its slot standing, within
	// the lease it holds.
	record slotRecord
}

// NewLogicalRelay returns a relay for ob's schema: it streams through a
// replication connection (replication=database) and holds its lease on a
// connection of its own, both to the database of pool's connections (or of
// cfg.ReplicationURL), and uses pool for its slot's set-up and the outbox
// table. pool may go through a transaction pooler when cfg.ReplicationURL
// reaches the server directly: Run returns a *PooledError when the
// replication connection or the lease goes through one.
func NewLogicalRelay(pool oncekit.Pool, ob *Outbox, pub broker.Publisher, cfg *LogicalRelayConfig) (*LogicalRelay, error) {
	if pool == nil || ob == nil || pub == nil {
		return nil, fmt.Errorf("%w: NewLogicalRelay: pool, outbox and publisher are required", ErrInvalidConfig)
	}
	if !ob.logical {
		return nil, fmt.Errorf("%w: NewLogicalRelay: the outbox writes to its table (set Config.Logical)", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	tbl, err := NewRelay(pool, ob, pub, &c.Table)
	if err != nil {
		return nil, err
	}
	m, err := newLogicalMetrics(c.Registerer, c.Standby != nil)
	if err != nil {
		return nil, err
	}
	var repl *pgx.ConnConfig
	if c.ReplicationURL != "" {
		repl, _ = parseDirect(c.ReplicationURL) // validated
	}
	return &LogicalRelay{pool: pool, repl: repl, ob: ob, pub: pub, cfg: c, tbl: tbl, m: m, sql: renderLogicalSQL(ob.schema),
		log: c.Logger.With("component", "outbox.logical_relay", "slot", ob.slot)}, nil
}

// Run waits for the lease, then streams until ctx ends or the stream
// fails; it runs the table's polling relay meanwhile. A lost connection
// is reconnected after a pause; what was not confirmed is sent again.
// While a Run of r has not returned, Run returns oncekit.ErrAlreadyRunning.
func (r *LogicalRelay) Run(ctx context.Context) error {
	if !r.running.TryLock() {
		return oncekit.ErrAlreadyRunning
	}
	defer r.running.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var tableErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		if tableErr = r.tbl.Run(ctx); tableErr != nil && ctx.Err() == nil {
			cancel()
		}
	})
	defer wg.Wait()
	for bo := r.restartBackoff(); ctx.Err() == nil; {
		err := r.leased(ctx)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, ErrSlotLost) {
			// Streaming from a new slot would skip what the lost one held:
			// the relay stops and the operator decides (the error says how).
			r.log.Error("logical relay stopped: its replication slot is lost", "err", err)
			cancel()
			wg.Wait()
			return err
		}
		if errors.Is(err, ErrPooled) || errors.Is(err, ErrDatabaseMismatch) {
			// No retry changes what the connection settings reach.
			r.log.Error("logical relay stopped: its replication connection cannot be used", "err", err)
			cancel()
			wg.Wait()
			return err
		}
		pause := bo.Next()
		r.log.Warn("logical relay stream ended; starting again", "err", err, "wait", pause)
		wait.Sleep(ctx, pause)
	}
	cancel()
	wg.Wait()
	if tableErr != nil && !errors.Is(tableErr, context.Canceled) {
		return tableErr
	}
	return nil
}

// heartbeatSuffix makes the prefix of the relay's heartbeats, and
// heartbeatSQL writes one.
const (
	heartbeatSuffix = ".heartbeat"
	heartbeatSQL    = `SELECT pg_logical_emit_message(false, $1, ''::bytea)`
)

// leaseSQL takes the advisory lock a LogicalRelay of slot holds while it
// streams.
const leaseSQL = `SELECT pg_try_advisory_lock(hashtextextended('oncekit.logical_relay.' || $1, 0))`

// leased takes the lease (waiting for it), sets the slot up and streams
// while the lease holds.
func (r *LogicalRelay) leased(ctx context.Context) error {
	// The lock lives with the session: it is taken on a connection of its
	// own, to the server itself (a transaction pooler would leave it on a
	// server connection the next client inherits), closed when the lease
	// ends.
	c, err := r.connectLease(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	// Another relay may stream between this one's leases: what this one
	// knew of the slot holds within a lease only.
	r.known.Store(0)
	defer r.known.Store(0)
	for waited := false; ; waited = true {
		var got bool
		if err := c.QueryRow(ctx, leaseSQL, r.ob.slot).Scan(&got); err != nil {
			return fmt.Errorf("take the lease: %w", err)
		}
		if got {
			break
		}
		if !waited {
			r.log.Info("another relay streams the slot; standing by")
		}
		r.m.standby.Set(1)
		_ = r.refreshSlot(ctx, false) // a standby's gauges show the slot too
		if !wait.Sleep(ctx, r.cfg.StatusInterval/4) {
			return ctx.Err()
		}
	}
	r.m.standby.Set(0)
	r.log.Info("lease taken; streaming")
	id, err := r.checkFailover(ctx)
	if err != nil {
		if errors.Is(err, ErrSlotLost) {
			r.m.lost.Set(1)
		}
		return err
	}
	r.startRecord(id)
	defer r.endRecord()
	if err := r.ob.SetUpLogical(ctx, r.pool); err != nil {
		if errors.Is(err, ErrSlotLost) {
			r.m.lost.Set(1)
		}
		return err
	}
	if err := r.refreshSlot(ctx, true); err != nil {
		return err
	}
	sctx, stop := context.WithCancelCause(ctx)
	var heartbeats sync.WaitGroup
	// Stopped and waited for before the deferred Close: the two must not
	// use the lease's connection at once.
	defer func() {
		stop(nil)
		heartbeats.Wait()
	}()
	heartbeats.Go(func() { // the lease holds while its session does
		t := time.NewTicker(r.cfg.StatusInterval)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				// The heartbeat: a message of no transaction, which the
				// stream brings back so that an idle slot moves with the
				// server (the session is the lease's check).
				if _, err := c.Exec(sctx, heartbeatSQL, walPrefix(r.ob.schema)+heartbeatSuffix); err != nil && sctx.Err() == nil {
					stop(fmt.Errorf("lease lost: %w", err))
					return
				}
				if err := r.refreshSlot(sctx, true); errors.Is(err, ErrSlotLost) {
					stop(err)
					return
				}
			}
		}
	})
	// The stream starts again within the lease, so that the slot's
	// position is known throughout: no other relay streams meanwhile.
	for bo := r.restartBackoff(); ; {
		err = r.stream(sctx, id)
		if sctx.Err() != nil {
			break
		}
		if errors.Is(err, ErrPooled) || errors.Is(err, errServerChanged) {
			return err
		}
		if lost := r.refreshSlot(sctx, true); errors.Is(lost, ErrSlotLost) {
			return lost
		}
		pause := bo.Next()
		r.log.Warn("logical relay stream ended; starting again", "err", err, "wait", pause)
		if !wait.Sleep(sctx, pause) {
			break
		}
	}
	if cause := context.Cause(sctx); cause != nil && ctx.Err() == nil {
		return cause
	}
	return err
}

// SetUpLogical creates what Config.Logical needs, when missing: the
// publication pgoutput reads (empty: messages need no table) and the
// replication slot, both named Config.Slot. Run it before the first
// Enqueue: the slot decodes only what commits after its creation. db must
// not be in a transaction that wrote.
//
// Having created the slot it records so in the schema's logical_slots
// table, apart from the publication (which the schema's owner may create
// beforehand, so that the relay's role needs no CREATE). A slot missing
// while its row is there was dropped: SetUpLogical then returns a
// *SlotLostError (ErrSlotLost) rather than create a slot that would skip
// what the old one held. A slot found without its row (set up before the
// table existed) gets its row.
func (o *Outbox) SetUpLogical(ctx context.Context, db oncekit.Querier) error {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, o.slot).Scan(&exists); err != nil {
		return fmt.Errorf("outbox: look up the publication: %w", err)
	}
	if !exists {
		if _, err := db.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{o.slot}.Sanitize()); err != nil && !isCode(err, "42710") {
			return fmt.Errorf("outbox: create the publication: %w", err)
		}
	}
	var created *time.Time
	if err := db.QueryRow(ctx, pgsql.Render(`SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1),
		(SELECT created_at FROM {schema}.logical_slots WHERE slot = $1)`, o.schema), o.slot).Scan(&exists, &created); err != nil {
		return fmt.Errorf("outbox: look up the slot: %w", err)
	}
	if !exists && created != nil {
		// The slot was made once and is gone: a new one would skip what
		// it held.
		return &SlotLostError{Slot: o.slot, Reason: "dropped", Created: *created}
	}
	if !exists {
		// PostgreSQL 17 keeps a failover slot on the standbys that sync
		// slots (sync_replication_slots), so that a failover keeps it.
		var version int
		if err := db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
			return fmt.Errorf("outbox: server version: %w", err)
		}
		create := `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`
		if version >= 170000 {
			create = `SELECT pg_create_logical_replication_slot($1, 'pgoutput', failover => true)`
		}
		_, err := db.Exec(ctx, create, o.slot)
		if err != nil && !isCode(err, "42710") {
			return fmt.Errorf("outbox: create the slot: %w", err)
		}
	}
	if created == nil {
		_, err := db.Exec(ctx, pgsql.Render(`INSERT INTO {schema}.logical_slots (slot) VALUES ($1) ON CONFLICT DO NOTHING`, o.schema), o.slot)
		if err != nil {
			return fmt.Errorf("outbox: record the slot in logical_slots: %w", err)
		}
	}
	return nil
}

const slotExistsSQL = `SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// walEvent is one message decoded from the WAL, with the end of its
// transaction: the position that may be confirmed once it and every event
// before it are settled.
type walEvent struct {
	msg      broker.Message
	txEnd    pglogrepl.LSN
	attempts int
	done     bool // acknowledged, or handed to the table
}

// stream runs one replication session: a reader decodes the stream and
// reports the confirmed position while the publisher publishes what it
// decoded as soon as it is there, so that no round waits for the next to be
// read, nor the next for a timer. It streams only from the server of the
// lease (errServerChanged otherwise).
func (r *LogicalRelay) stream(ctx context.Context, lease serverIdentity) error {
	conn, err := r.connectReplication(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := sameServer(ctx, conn, lease); err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, r.ob.slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.ob.slot + "'", "messages 'true'"},
	})
	if err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	txs := make(chan walTx, r.cfg.BatchSize)
	s := &session{r: r}
	rd := &reader{r: r, conn: conn, prefix: walPrefix(r.ob.schema), out: txs, flushable: &s.flushed, statusAt: time.Now()}
	var read sync.WaitGroup
	read.Go(func() { stop(rd.run(sctx)) })
	err = s.run(sctx, txs)
	stop(err)
	read.Wait()
	if cause := context.Cause(sctx); ctx.Err() == nil && cause != nil {
		return cause
	}
	return ctx.Err()
}
