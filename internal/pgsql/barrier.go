package pgsql

import (
	"context"
	"sync"
	"time"

	"github.com/oncekit/oncekit"
)

// SyncBarrierSQL, run in a transaction, makes that transaction's commit
// return only once the synchronous standbys have flushed the WAL up to it,
// when the server names any (synchronous_standby_names); otherwise it does
// nothing. It writes a transactional logical message (an xid and a WAL
// record, nothing in any table) and asks for synchronous_commit = on for
// the transaction, whatever the session's setting.
//
// Why: a transaction that committed on the primary is visible there before
// its synchronous standby has it whenever its wait was cancelled, which
// PostgreSQL allows ("canceling wait for synchronous replication ... The
// transaction has already committed locally"), and which pgx does on its
// own: when a connection breaks or a context ends during a statement, pgx
// sends a CancelRequest before it closes the connection. A reader that acts
// on such a row (publishes it, answers a client with it, acks a message as
// already processed) acts on a fact a failover can erase. Everything the
// transaction saw was committed before the barrier's commit record, so once
// that record is on the standby, so is what it saw. The barrier must run on
// the connection that read, so that a failover in between cannot let it
// pass on the new primary for rows read on the old one.
const SyncBarrierSQL = `SELECT pg_logical_emit_message(true, 'oncekit.sync-barrier', '')
	FROM (SELECT set_config('synchronous_commit', 'on', true)) s
	WHERE current_setting('synchronous_standby_names') <> ''`

// SyncStandbysSQL asks whether the server names synchronous standbys.
const SyncStandbysSQL = `SELECT current_setting('synchronous_standby_names') <> ''`

// syncCheckEvery is how often SyncStandbys asks the server again.
const syncCheckEvery = 10 * time.Second

// SyncStandbys tells whether the server names synchronous standbys, asking
// it at most every ten seconds. The zero value is ready to use; until its
// first answer, and after a failed look, it says yes: a barrier too many
// costs a round trip, one too few can cost a phantom.
type SyncStandbys struct {
	mu sync.Mutex
	on bool
	at time.Time
}

// On reports whether the server behind q names synchronous standbys.
func (s *SyncStandbys) On(ctx context.Context, q oncekit.Querier) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.at.IsZero() && time.Since(s.at) < syncCheckEvery {
		return s.on
	}
	var on bool
	if err := q.QueryRow(ctx, SyncStandbysSQL).Scan(&on); err != nil {
		return true
	}
	s.on, s.at = on, time.Now()
	return on
}
