package inbox

import (
	"errors"
	"io"

	"github.com/jackc/pgx/v5/pgconn"
)

// transient reports whether err is PostgreSQL's failure rather than the
// message's: the connection was lost or refused, the server is shutting
// down or starting, it has no connection to spare, or the transaction lost
// a serialization conflict or a deadlock. Such a failure says nothing about
// the message, so it never counts towards dead-lettering: the message is
// tried again until it succeeds or fails on its own account.
func transient(err error) bool {
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
		errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.SafeToRetry(err)
}
