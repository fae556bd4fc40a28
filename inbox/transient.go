package inbox

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// transient reports whether a handler's failure in tx is PostgreSQL's
// rather than the message's: the transaction's connection was lost (a cut
// connection surfaces as a bare "unexpected EOF", so the connection's state
// is the evidence, not the error's text), or the error says the connection
// failed or was refused, the server is shutting down or starting, it has no
// connection to spare, or the transaction lost a serialization conflict or
// a deadlock. Such a failure says nothing about the message, so it never
// counts towards dead-lettering: the message is tried again until it
// succeeds or fails on its own account.
func transient(tx pgx.Tx, err error) bool {
	if tx != nil && tx.Conn() != nil && tx.Conn().IsClosed() {
		return true
	}
	return transientErr(err)
}

// transientErr is transient's judgement of the error alone.
func transientErr(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) == 5 && pgErr.Code[:2] == "08": // connection exception
			return true
		}
		switch pgErr.Code {
		case "57P01", "57P02", "57P03", // admin shutdown, crash shutdown, cannot connect now
			"53300",          // too many connections
			"40001", "40P01": // serialization failure, deadlock detected
			return true
		}
		return false
	}
	var connErr *pgconn.ConnectError
	return errors.As(err, &connErr) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		pgconn.SafeToRetry(err)
}
