package pgsql

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"oncekit", "_x", "a1_b2", "t_0123456789abcdef"} {
		got, err := ValidateSchema(ok)
		require.NoError(t, err, ok)
		require.Equal(t, ok, got)
	}
	got, err := ValidateSchema("")
	require.NoError(t, err)
	require.Equal(t, DefaultSchema, got)
	for _, bad := range []string{"Oncekit", "1abc", "a-b", `x"; drop table y; --`, "a b", "ünï",
		"a234567890123456789012345678901234567890123456789012345678901234"} {
		_, err := ValidateSchema(bad)
		require.True(t, errors.Is(err, ErrInvalidSchema), bad)
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	require.Equal(t, `SELECT 1 FROM "s".outbox JOIN "s".x`, Render("SELECT 1 FROM {schema}.outbox JOIN {schema}.x", "s"))
}
