package pgsql

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Broken reports whether err says that a statement cannot succeed as it is
// sent, whatever the message or row it carries, so that sending it again
// cannot cure it: pgx refused to send it (an argument it cannot encode, a
// wrong number of arguments, a result it cannot scan), or PostgreSQL
// refused the statement itself: a syntax error or an access rule violation
// (SQLSTATE class 42: an undefined table, column or function, a missing
// grant), a feature not supported (0A), a read-only transaction (25006),
// an invalid schema or database name (3F000, 3D000), an unknown prepared
// statement (26000: a pooler that does not track them), or a role that may
// not log in (class 28).
//
// A connection lost or refused, a timeout, a cancelled context, a shutdown,
// a server short of resources, a serialization failure or a deadlock (08,
// 53, 57, 40, 55P03) is not broken: it passes. Neither is a row PostgreSQL
// refuses for the data it carries (Refused): that is the row's.
func Broken(err error) bool { return BrokenClass(err) != "" }

// BrokenClass is Broken's verdict as a bounded metric label: the SQLSTATE
// class of a statement PostgreSQL refused ("42", "0A", "25", "3F", "3D",
// "26", "28"), "client" for a statement pgx refused to send, or "" when err
// is not broken.
func BrokenClass(err error) string {
	if err == nil {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		if len(code) != 5 {
			return ""
		}
		switch class := code[:2]; {
		case class == "42", class == "0A", class == "28", class == "3F":
			return class
		case code == "25006", code == "3D000", code == "26000":
			return class
		}
		return ""
	}
	var scanErr pgx.ScanArgError
	var scanErrP *pgx.ScanArgError
	if errors.As(err, &scanErr) || errors.As(err, &scanErrP) {
		return "client"
	}
	// pgx's errors for arguments it cannot send have no type of their own.
	msg := err.Error()
	for _, s := range clientRefusals {
		if strings.Contains(msg, s) {
			return "client"
		}
	}
	return ""
}

// clientRefusals are the texts of pgx's errors for a statement it refused
// to send: an argument it cannot encode (extended_query_builder.go,
// pgtype), or the wrong number of arguments (conn.go).
var clientRefusals = []string{
	"failed to encode args[",
	"unable to encode ",
	" arguments, got ",
}
