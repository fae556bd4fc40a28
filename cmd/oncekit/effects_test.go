package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

// runEffectsCLI runs the oncekit command line in-process.
func runEffectsCLI(t *testing.T, db *testenv.DB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string {
		switch k {
		case "DATABASE_URL":
			if db != nil {
				return db.URL
			}
		case "ONCEKIT_SCHEMA":
			if db != nil {
				return db.Schema
			}
		}
		return ""
	}}
	code = run(context.Background(), e, args)
	return code, out.String(), errb.String()
}

func TestEffectsCLIUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"effects"},
		{"effects", "bogus"},
		{"effects", "list", "--state", "weird"},
		{"effects", "retry"},
		{"effects", "retry", "abc"},
		{"effects", "resolve", "1", "confirmed"}, // no --by/--reason
		{"effects", "resolve", "1", "pending", "--by", "a", "--reason", "b"}, // wrong target
		{"dispatch"}, // no endpoints
		{"dispatch", "--endpoint", "nokind"},
		{"dispatch", "--endpoint", "k=ftp://x", "--database-url", "postgres://127.0.0.1:1/x"},
	} {
		code, _, stderr := runEffectsCLI(t, nil, args...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
	}
	path := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"endpoints":{"k":{"url":"http://x","tiemout":"1s"}}}`), 0o600))
	code, _, stderr := runEffectsCLI(t, nil, "dispatch", "--config", path)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "tiemout")
}

func TestEffectsCLIListRetryResolvePurge(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	l, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	var ids []int64
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, src := range []string{"a", "b", "c"} {
			r, err := l.Record(ctx, tx, sideeffect.Effect{SourceID: src, Kind: "mail"})
			if err != nil {
				return err
			}
			ids = append(ids, r.ID)
		}
		return nil
	}))
	_, err = db.Pool.Exec(ctx, `UPDATE side_effects SET state = 'unknown', last_error = 'lease expired' WHERE id = ANY($1)`, ids[:2])
	require.NoError(t, err)

	code, out, stderr := runEffectsCLI(t, db, "effects", "list", "--state", "unknown")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "STATE")
	require.Contains(t, out, strconv.FormatInt(ids[0], 10))
	require.NotContains(t, out, "pending")

	code, out, stderr = runEffectsCLI(t, db, "effects", "list", "--json", "--kind", "mail")
	require.Equal(t, 0, code, stderr)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed, 3)

	code, out, stderr = runEffectsCLI(t, db, "effects", "resolve", strconv.FormatInt(ids[0], 10), "failed", "--by", "ana", "--reason", "cancelled")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "resolved as failed by ana")

	code, _, stderr = runEffectsCLI(t, db, "effects", "resolve", strconv.FormatInt(ids[2], 10), "failed", "--by", "ana", "--reason", "x")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "wrong state")

	code, out, stderr = runEffectsCLI(t, db, "effects", "retry", strconv.FormatInt(ids[1], 10), "--by", "bo")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "pending again")
	r, err := l.Get(ctx, db.Pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, sideeffect.StatePending, r.State)
	require.Equal(t, "bo", r.ResolvedBy)

	_, err = db.Pool.Exec(ctx, `UPDATE side_effects SET created_at = now() - interval '2 days'`)
	require.NoError(t, err)
	code, out, stderr = runEffectsCLI(t, db, "effects", "prune", "--older-than", "24h")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "deleted 1 ")
	code, out, stderr = runEffectsCLI(t, db, "effects", "purge", "--older-than", "24h") // the former name
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "deleted 0 ")
}
