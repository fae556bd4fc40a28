package report_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
	"github.com/oncekit/oncekit/report"
)

// A schema name from a caller's configuration never reaches the SQL
// unchecked: Read refuses it before it runs a statement (tx is not touched).
func TestReadRefusesAnInvalidSchema(t *testing.T) {
	t.Parallel()
	_, err := report.Read(context.Background(), nil, `x"; DROP SCHEMA oncekit; --`, "", 0, 0)
	require.ErrorIs(t, err, oncekit.ErrInvalidSchema)
}
