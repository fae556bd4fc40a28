package outbox

import "context"

// Healthy reports nil unless a statement of the relay's loops (a batch's
// read and settle, the heartbeat, the lease renewal or acquisition) is
// failing in a way that sending it again cannot cure: a missing grant on
// the outbox or the relay's tables, a table or column that is not there, a
// read-only server, an argument the driver cannot encode. The error names
// the statement, since when it fails and PostgreSQL's answer; it wraps
// oncekit.ErrStatementBroken. Meanwhile the relay backs off and retries,
// publishes nothing it has not marked and skips nothing; each distinct
// cause is logged at error level once a minute and counted in
// oncekit_outbox_statement_errors_total. Healthy turns nil again at the
// statement's next success.
func (r *Relay) Healthy(context.Context) error { return r.watch.Err() }

// Partitions returns the partition count the relay leases from, as read at
// its start and again on every lease round (it follows a repartition), or 0
// before Run has read it.
func (r *Relay) Partitions() int { return int(r.parts.Load()) }

// failed logs err from statement at warning level with msg and attrs,
// unless it is a statement that cannot succeed as sent: the watch logs
// that at error level, counts it and reports it.
func (r *Relay) failed(statement string, err error, msg string, attrs ...any) {
	if r.watch.Failed(statement, err) {
		return
	}
	r.log.Warn(msg, append(attrs, "err", err)...)
}
