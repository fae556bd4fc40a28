// Package cfgerrtest holds the assertion the Config tests of every package
// make about the errors package cfgerr builds.
package cfgerrtest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// RequireField fails t unless err is the error for field (written "pkg:
// Config.Field") wrapping sentinel: its text is field + ": " + detail, or,
// when detail is empty, starts with field + ": ".
func RequireField(t testing.TB, err, sentinel error, field, detail string) {
	t.Helper()
	require.ErrorIs(t, err, sentinel)
	if detail != "" {
		require.EqualError(t, err, field+": "+detail)
		return
	}
	require.True(t, strings.HasPrefix(err.Error(), field+": "), "%v", err)
}
