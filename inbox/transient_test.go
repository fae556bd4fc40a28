package inbox

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestTransientFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"the handler's own unexpected EOF", fmt.Errorf("read attachment: %w", io.ErrUnexpectedEOF), false},
		{"closed connection", fmt.Errorf("x: %w", pgconn.ErrConnClosed), true},
		{"server shutting down", &pgconn.PgError{Code: "57P01"}, true},
		{"server starting", fmt.Errorf("x: %w", &pgconn.PgError{Code: "57P03"}), true},
		{"connection exception class", &pgconn.PgError{Code: "08006"}, true},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, true},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"syntax error", &pgconn.PgError{Code: "42601"}, false},
		{"the handler's own error", errors.New("amount must be positive"), false},
	} {
		require.Equal(t, tc.want, transient(nil, tc.err), tc.name)
	}
}
