package outbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/backoff"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/pgsql"
	"github.com/oncekit/oncekit/internal/promshare"
	"github.com/oncekit/oncekit/internal/untrusted"
	"github.com/oncekit/oncekit/internal/wait"
)

// session is the publisher's state for one replication session.
type session struct {
	r *LogicalRelay

	pending   []walEvent    // committed, not yet all settled, in commit order
	flushable pglogrepl.LSN // past every settled transaction, or a heartbeat's while nothing was pending
	flushed   atomic.Uint64 // flushable, for the reader to report
	failures  int           // consecutive failed rounds
}

// run publishes what the reader hands on: it waits for the first
// transaction, takes every other one already there (up to BatchSize
// events) and publishes them as a round; the reader reads the next round
// meanwhile.
func (s *session) run(ctx context.Context, in <-chan walTx) error {
	for {
		if len(s.pending) == 0 {
			select {
			case t := <-in:
				s.take(t)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	gather:
		for len(s.pending) < s.r.cfg.BatchSize {
			select {
			case t := <-in:
				s.take(t)
			default:
				break gather
			}
		}
		if len(s.pending) > 0 {
			if err := s.publish(ctx); err != nil {
				return err
			}
		}
		s.flushed.Store(uint64(s.flushable))
	}
}

// take appends t's events to pending; a transaction with none of them
// (or a heartbeat) may be confirmed at once when nothing is pending.
func (s *session) take(t walTx) {
	if len(t.events) == 0 {
		if len(s.pending) == 0 {
			s.flushable = max(s.flushable, t.end)
		}
		return
	}
	s.pending = append(s.pending, t.events...)
}

// publish sends the pending events that are not settled yet, each key's in
// order; events of a key that has rows in the outbox table go there, behind
// them. It confirms what it settled, and after a failed round waits before
// the next.
func (s *session) publish(ctx context.Context) error {
	r := s.r
	tabled, err := r.tableKeys(ctx, s.pending)
	if err != nil {
		return err
	}
	var toTable, send []int
	for i := range s.pending {
		switch e := &s.pending[i]; {
		case e.done:
		case e.msg.Key != "" && tabled[e.msg.Key]:
			toTable = append(toTable, i)
		default:
			send = append(send, i)
		}
	}
	if err := s.toTable(ctx, toTable, nil); err != nil {
		return err
	}
	msgs := make([]broker.Message, len(send))
	for j, i := range send {
		msgs[j] = s.pending[i].msg
	}
	kp := keyedPublisher{pub: r.pub, timeout: func() time.Duration { return r.cfg.PublishTimeout }}
	res := kp.publish(ctx, msgs)
	crashpoint.Hit("logical.after-publish")
	nacked := 0
	var refused []int        // indexes into pending
	errs := map[int]string{} // of refused, by index into pending
	for j, o := range res.outcome {
		switch i := send[j]; o {
		case acked:
			s.pending[i].done = true
			nacked++
		case failed:
			refused = append(refused, i)
			errs[i] = untrusted.Text(res.errs[j].Error(), maxErrBytes)
		}
	}
	// A failure counts as the message's attempt only while the broker is
	// reachable: an outage parks nothing.
	if !res.down {
		for _, i := range refused {
			s.pending[i].attempts++
		}
	}
	r.m.published.Add(float64(nacked))
	if len(refused) > 0 {
		r.m.failures.Add(float64(len(refused)))
		// A message that keeps failing while the broker takes others is
		// parked, its key's later messages behind it in the table.
		var park []int
		for _, i := range refused {
			if s.pending[i].attempts >= r.cfg.MaxAttempts {
				park = append(park, i)
			}
		}
		if err := s.toTable(ctx, park, errs); err != nil {
			return err
		}
	}
	s.settle()
	if len(refused) == 0 {
		s.failures = 0
		return nil
	}
	s.failures++
	pause := backoff.Policy{Min: r.cfg.MinBackoff, Max: r.cfg.MaxBackoff}.Delay(s.failures)
	r.log.Warn("publish failed; trying again", "failed", len(refused), "acknowledged", nacked, "wait", pause,
		"err", errs[refused[0]])
	s.flushed.Store(uint64(s.flushable)) // reported during the pause
	wait.Sleep(ctx, pause)
	return nil
}

// settle drops the settled events from the head of pending, up to the end
// of the last transaction whose every event is settled: the position that
// may be confirmed.
func (s *session) settle() {
	cut := 0
	for i := range s.pending {
		if !s.pending[i].done {
			break
		}
		if i+1 == len(s.pending) || s.pending[i+1].txEnd != s.pending[i].txEnd {
			cut = i + 1
		}
	}
	if cut > 0 {
		s.flushable = max(s.flushable, s.pending[cut-1].txEnd)
		s.pending = append(s.pending[:0], s.pending[cut:]...)
	}
}

// toTable writes pending events into the outbox table, in order: parked
// (with their error) when errs has their index, else pending behind the
// held rows of their key, for the table's relay. Each is then settled.
func (s *session) toTable(ctx context.Context, idx []int, errs map[int]string) error {
	if len(idx) == 0 {
		return nil
	}
	r := s.r
	var err error
	ids := make([]pgtype.UUID, len(idx))
	hashes, attempts := make([]int64, len(idx)), make([]int32, len(idx))
	keys, subjects, headers, lastErrs := make([]string, len(idx)), make([]string, len(idx)), make([]*string, len(idx)), make([]*string, len(idx))
	payloads := make([][]byte, len(idx))
	for k, i := range idx {
		e := &s.pending[i]
		ids[k], hashes[k], keys[k], subjects[k] = pgsql.UUID(e.msg.ID), int64(partitionHash(e.msg)), e.msg.Key, e.msg.Subject
		payloads[k], attempts[k] = e.msg.Payload, int32(e.attempts)
		if payloads[k] == nil {
			payloads[k] = []byte{}
		}
		if headers[k], err = headersJSON(e.msg.Headers); err != nil {
			return err
		}
		if msg, ok := errs[i]; ok {
			lastErrs[k] = &msg
		}
	}
	if _, err := r.pool.Exec(ctx, r.sql.toTable, ids, hashes, keys, subjects, payloads, headers, attempts, lastErrs); err != nil {
		return fmt.Errorf("outbox: write to the table: %w", err)
	}
	r.tbl.probeNow() // the table's relay looks at once
	for _, i := range idx {
		s.pending[i].done = true
		if _, parked := errs[i]; parked {
			r.m.parked.Inc()
			r.log.Error("message parked in the outbox table after failed publishes", "id", s.pending[i].msg.ID,
				"subject", untrusted.Printable(s.pending[i].msg.Subject), "attempts", s.pending[i].attempts, "err", errs[i])
		}
	}
	return nil
}

// tableKeys returns which keys of pending have rows in the outbox table:
// their events are published from there, behind those rows.
func (r *LogicalRelay) tableKeys(ctx context.Context, pending []walEvent) (map[string]bool, error) {
	var keys []string
	for _, e := range pending {
		if !e.done && e.msg.Key != "" {
			keys = append(keys, e.msg.Key)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	rows, err := r.pool.Query(ctx, r.sql.tableKeys, keys)
	if err != nil {
		return nil, fmt.Errorf("outbox: read the table's keys: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out[k] = true
	}
	return out, rows.Err()
}

// logicalSQL holds the LogicalRelay's statements for a schema.
type logicalSQL struct{ toTable, tableKeys string }

func renderLogicalSQL(schema string) logicalSQL {
	return logicalSQL{
		toTable: pgsql.Render(`
INSERT INTO {schema}.outbox (id, partition, epoch, ordering_key, subject, payload, headers, attempts, last_error, parked_at)
SELECT m.id, `+partitionExpr("m.h", "(SELECT partitions FROM {schema}.outbox_epoch)")+`, (SELECT epoch FROM {schema}.outbox_epoch),
	m.key, m.subject, m.payload, m.headers::jsonb, m.attempts, m.err, CASE WHEN m.err IS NOT NULL THEN now() END
FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::int[], $8::text[])
	WITH ORDINALITY AS m(id, h, key, subject, payload, headers, attempts, err, ord)
ORDER BY m.ord
ON CONFLICT (id) DO NOTHING`, schema),
		tableKeys: pgsql.Render(`SELECT DISTINCT ordering_key FROM {schema}.outbox WHERE ordering_key = ANY($1::text[])`, schema),
	}
}

type logicalMetrics struct {
	published, failures, parked, undecodable prometheus.Counter
	lag, standby                             prometheus.Gauge
	retained, active, lost, lagSeconds       prometheus.Gauge
	standbyReady, standbyLag                 prometheus.Gauge // registered with a Standby only
}

func newLogicalMetrics(reg prometheus.Registerer, standby bool) (*logicalMetrics, error) {
	const ns, sub = "oncekit", "outbox_logical"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &logicalMetrics{
		published:   counter("published_total", "Messages from the WAL the broker acknowledged."),
		failures:    counter("publish_failures_total", "Failed publishes of messages from the WAL."),
		parked:      counter("parked_total", "Messages from the WAL parked in the outbox table after failed publishes."),
		undecodable: counter("undecodable_total", "WAL messages under the outbox's prefix that Enqueue did not write, skipped."),
		lag:         gauge("slot_lag_bytes", "WAL the replication slot holds back: the server's position minus the slot's confirmed one."),
		standby:     gauge("standby", "1 while this relay waits for the lease another relay holds."),
		retained:    gauge("slot_retained_bytes", "WAL the replication slot keeps on the server's disk: the server's position minus the slot's restart one."),
		active:      gauge("slot_active", "1 while a relay streams from the replication slot (as PostgreSQL sees it), 0 while none does."),
		lost:        gauge("slot_lost", "1 once the replication slot was dropped, invalidated (wal_status lost) or replaced: the relay stops."),
		lagSeconds:  gauge("slot_lag_seconds", "The slot's lag in time as PostgreSQL measures it while a relay streams (pg_stat_replication.flush_lag; PostgreSQL 17: the time an inactive slot has been inactive); NaN when unknown."),
	}
	m.standbyReady = gauge("standby_slot_ready", "1 while the standby's copy of the replication slot would survive a failover (PostgreSQL 17: synced, persisted, valid, within StandbyMaxLag of the primary's), 0 while not or while the standby cannot be read; only with LogicalRelayConfig.Standby.")
	m.standbyLag = gauge("standby_slot_lag_bytes", "How far the standby's copy of the replication slot is behind the primary's confirmed position; only with LogicalRelayConfig.Standby.")
	cs := []prometheus.Collector{m.published, m.failures, m.parked, m.undecodable, m.lag, m.standby, m.retained, m.active, m.lost, m.lagSeconds}
	if standby {
		cs = append(cs, m.standbyReady, m.standbyLag)
	}
	if err := promshare.RegisterAlone(reg, "outbox: LogicalRelayConfig.Registerer", "logical relay", cs...); err != nil {
		return nil, err
	}
	return m, nil
}
