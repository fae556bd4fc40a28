package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testenv"
)

func TestDriftCommandExitCodes(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY); INSERT INTO orders VALUES ('o1')`)
	require.NoError(t, err)

	drift := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		e := &env{stdout: &out, stderr: &errOut, getenv: func(k string) string {
			if k == "DATABASE_URL" {
				return testenv.DatabaseURL()
			}
			return ""
		}}
		code := run(ctx, e, append([]string{"drift", "--schema", db.Schema}, args...))
		return code, out.String(), errOut.String()
	}

	code, out, _ := drift()
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "outbox_backlog")

	expect := "--expect=receipts=email:SELECT id FROM " + db.Schema + ".orders"
	code, out, _ = drift(expect)
	require.Equal(t, exitDrift, code)
	require.Contains(t, out, "receipts: missing o1")

	_, err = db.Pool.Exec(ctx, `INSERT INTO side_effects (source_id, kind, idempotency_key, state) VALUES ('o1', 'email', 'k', 'confirmed')`)
	require.NoError(t, err)
	code, out, _ = drift(expect)
	require.Equal(t, 0, code, out)

	code, _, stderr := drift("--rule=broken=SELECT nope")
	require.Equal(t, exitCheckError, code)
	require.Contains(t, stderr, "check broken")

	code, _, _ = drift("--rule=no-equals-sign")
	require.Equal(t, 2, code)
	code, _, _ = drift("--schema", "Robert'); DROP TABLE students;--")
	require.Equal(t, 2, code)
}
