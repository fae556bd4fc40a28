package outbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/oncekit/oncekit/internal/untrusted"
)

// walTx is one committed transaction as the reader hands it to the
// publisher: its events (none when it wrote none of the outbox's, or for a
// heartbeat) and the position past it.
type walTx struct {
	events []walEvent
	end    pglogrepl.LSN
}

// reader owns the replication connection: it decodes the stream into
// transactions for the publisher and reports the position the publisher
// settled to PostgreSQL.
type reader struct {
	r      *LogicalRelay
	conn   *pgconn.PgConn
	prefix string
	out    chan<- walTx

	// flushable is the publisher's: the position that may be confirmed.
	flushable *atomic.Uint64
	confirmed pglogrepl.LSN // reported to PostgreSQL as flushed
	statusAt  time.Time

	inTx     bool
	txEvents []walEvent // the open transaction's events
}

// readerTick is the longest the reader waits on the stream before it looks
// whether the settled position moved and should be reported.
const readerTick = 100 * time.Millisecond

// run reads until ctx ends or the stream fails.
func (rd *reader) run(ctx context.Context) error {
	for ctx.Err() == nil {
		// A read deadline rather than a context of its own for each
		// message: the context and the watch pgconn sets on it cost more
		// than decoding the message. ctx's end is seen within readerTick.
		wait := min(readerTick, max(rd.r.cfg.StatusInterval-time.Since(rd.statusAt), time.Millisecond))
		if err := rd.conn.Conn().SetReadDeadline(time.Now().Add(wait)); err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		raw, err := rd.conn.ReceiveMessage(context.Background())
		switch {
		case err != nil && pgconn.Timeout(err) && ctx.Err() == nil:
		case err != nil:
			return fmt.Errorf("receive: %w", err)
		default:
			switch msg := raw.(type) {
			case *pgproto3.ErrorResponse:
				return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(msg))
			case *pgproto3.CopyData:
				if err := rd.copyData(ctx, msg.Data); err != nil {
					return err
				}
			}
		}
		if err := rd.report(ctx, false); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (rd *reader) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		// Its position is the server's WAL end, which may be ahead of what
		// was decoded and sent: never confirmed (the heartbeats are).
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		if k.ReplyRequested {
			return rd.report(ctx, true)
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		return rd.decode(ctx, x.WALData)
	}
	return nil
}

func (rd *reader) decode(ctx context.Context, data []byte) error {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		rd.inTx, rd.txEvents = true, nil
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix == rd.prefix+heartbeatSuffix && !m.Transactional {
			// Every transaction that committed before it has been handed
			// on: once they are settled, the slot may move past it.
			if !rd.inTx {
				return rd.emit(ctx, walTx{end: m.LSN})
			}
			return nil
		}
		if m.Prefix != rd.prefix || !m.Transactional {
			return nil
		}
		msg, err := walDecode(m.Content)
		if err != nil {
			// Not a message Enqueue wrote: someone else used the prefix.
			rd.r.m.undecodable.Inc()
			rd.r.log.Error("skipping a WAL message under the outbox's prefix that Enqueue did not write",
				"lsn", m.LSN.String(), "err", err, "content", untrusted.Text(string(m.Content), 200))
			return nil
		}
		rd.txEvents = append(rd.txEvents, walEvent{msg: msg})
	case *pglogrepl.CommitMessage:
		for i := range rd.txEvents {
			rd.txEvents[i].txEnd = m.TransactionEndLSN
		}
		t := walTx{events: rd.txEvents, end: m.TransactionEndLSN}
		rd.inTx, rd.txEvents = false, nil
		return rd.emit(ctx, t)
	}
	return nil
}

// emit hands t to the publisher, reporting the position meanwhile while
// the publisher has no room for it (a broker outage), so that PostgreSQL
// keeps hearing from the relay.
func (rd *reader) emit(ctx context.Context, t walTx) error {
	select {
	case rd.out <- t:
		return nil
	default:
	}
	tick := time.NewTicker(readerTick)
	defer tick.Stop()
	for {
		select {
		case rd.out <- t:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if err := rd.report(ctx, false); err != nil {
				return err
			}
		}
	}
}

// report tells PostgreSQL how far the slot may move: past every
// transaction the publisher settled and, when nothing was pending, past
// the last heartbeat (which keeps an idle schema's slot from holding WAL
// back). It sends when forced, when the position moved (at most every 50
// ms), and at least every StatusInterval.
func (rd *reader) report(ctx context.Context, force bool) error {
	pos := max(pglogrepl.LSN(rd.flushable.Load()), rd.confirmed)
	moved := pos > rd.confirmed && time.Since(rd.statusAt) >= 50*time.Millisecond
	if !force && !moved && time.Since(rd.statusAt) < rd.r.cfg.StatusInterval {
		return nil
	}
	// Known before PostgreSQL may read it: the relay's check of its slot
	// must never see the slot past what the relay knows it sent.
	rd.r.noteConfirmed(pos)
	err := pglogrepl.SendStandbyStatusUpdate(ctx, rd.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
	if err != nil {
		return fmt.Errorf("report the position: %w", err)
	}
	rd.confirmed, rd.statusAt = pos, time.Now()
	return nil
}
