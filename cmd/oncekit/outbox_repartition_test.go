package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// `oncekit outbox repartition`: bad counts are usage errors, a change is
// made and shown, and a second one while the first drains (no relay runs)
// is refused.
func TestOutboxRepartition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	vars := dbVars(db)
	for _, bad := range []string{"-1", "1025", "x"} {
		code, _, stderr := cli(t, vars, "outbox", "repartition", "--partitions", bad)
		require.Equal(t, 2, code, "--partitions %s: %s", bad, stderr)
	}
	code, stdout, stderr := cli(t, vars, "outbox", "repartition")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "partitions 16 (epoch 0, previously 0, changed ")
	require.Contains(t, stdout, "): done")

	code, _, stderr = cli(t, vars, "outbox", "repartition", "--partitions", "16")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "the outbox already has that partition count: 16")

	code, stdout, stderr = cli(t, vars, "outbox", "repartition", "--partitions", "64")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "repartitioned the outbox from 16 to 64 partitions (epoch 1): "+
		"the relays publish what was written before the change first, then the rest\n", stdout)

	code, _, stderr = cli(t, vars, "outbox", "repartition", "--partitions", "16")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "a repartition is in progress: epoch 1, phase drain (from 16 to 64 partitions)")
	code, stdout, _ = cli(t, vars, "outbox", "repartition")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "partitions 64 (epoch 1, previously 16, changed ")
	require.Contains(t, stdout, "): draining: rows written before the change are being published")
}
