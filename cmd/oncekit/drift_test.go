package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
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

	code, out, _ = drift("--rule=broken=SELECT nope")
	require.Equal(t, exitCheckError, code)
	require.Contains(t, out, "broken: could not run")

	code, _, _ = drift("--rule=no-equals-sign")
	require.Equal(t, 2, code)
	code, _, _ = drift("--schema", "Robert'); DROP TABLE students;--")
	require.Equal(t, 2, code)
}

func TestDriftCommandOutputs(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE payments (id text PRIMARY KEY);
		INSERT INTO payments VALUES ('p1'), ('p2');
		INSERT INTO side_effects (source_id, kind, idempotency_key, state, payload, next_attempt_at) VALUES
			('p1', 'receipt', 'k1', 'confirmed', '{}', NULL), ('p2', 'receipt', 'k2', 'confirmed', '{}', NULL),
			('e1', 'capture', 'k3', 'confirmed', convert_to('{"payment_id":"p1"}', 'UTF8'), NULL),
			('e2', 'capture', 'k4', 'confirmed', convert_to('{"payment_id":"p2"}', 'UTF8'), NULL)`)
	require.NoError(t, err)
	vars := dbVars(db)
	receipts := "--expect=receipts=receipt:SELECT id FROM " + db.Schema + ".payments"
	captures := "--expect=captures=capture@$.payment_id:SELECT id FROM " + db.Schema + ".payments"

	// Two kinds expected per payment row, on a clean chain: exit 0. A rule
	// may end with a semicolon.
	code, out, stderr := cli(t, vars, "drift", receipts, captures, "--rule=none=SELECT 1 WHERE false;")
	require.Equal(t, 0, code, "%s%s", out, stderr)

	// --json and --textfile.
	prom := filepath.Join(t.TempDir(), "oncekit.prom")
	code, out, stderr = cli(t, vars, "drift", "--json", "--textfile", prom, receipts)
	require.Equal(t, 0, code, stderr)
	var rep struct {
		Drifted  bool `json:"drifted"`
		Findings []struct {
			Check  string `json:"check"`
			Status string `json:"status"`
		} `json:"findings"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.False(t, rep.Drifted)
	require.Equal(t, "receipts", rep.Findings[len(rep.Findings)-1].Check)
	text, err := os.ReadFile(prom)
	require.NoError(t, err)
	require.Contains(t, string(text), `oncekit_drift_findings{check="receipts"} 0`)
	require.Contains(t, string(text), "oncekit_drift_last_run_timestamp_seconds")
	require.NotContains(t, string(text), "go_goroutines", "node_exporter has its own")

	// A rules file; a command-line threshold wins over the file's.
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rules, []byte(`
check_timeout: 3s
rules:
  - name: slow
    sql: SELECT 1 FROM pg_sleep(30)
  - name: captures
    expect:
      kind: capture
      sources: SELECT id FROM `+db.Schema+`.payments UNION ALL SELECT 'p3'
      business_id: $.payment_id
`), 0o600))
	code, out, stderr = cli(t, vars, "drift", "--rules", rules)
	require.Equal(t, exitDrift, code, "drift wins over a check that could not run: %s%s", out, stderr)
	require.Contains(t, out, "captures: missing p3")
	require.Contains(t, out, "slow: could not run: timed out after 3s")
	// (Long enough for the built-in checks on a loaded machine: 100 ms
	// did not fit, once, nor 300 ms.)
	code, out, _ = cli(t, vars, "drift", "--rules", rules, "--check-timeout", "2s",
		"--rule=slow2=SELECT 1 WHERE false", "--max-outbox-age", "1h")
	require.Equal(t, exitDrift, code)
	require.Contains(t, out, "slow: could not run: timed out after 2s")
	require.Regexp(t, `outbox_oldest_age_seconds\s+0\s+3600\s`, out)

	// Only a check that could not run: exit 3, with the others reported.
	code, out, _ = cli(t, vars, "drift", "--check-timeout", "3s", "--rule=slow=SELECT 1 FROM pg_sleep(30)")
	require.Equal(t, exitCheckError, code)
	require.Contains(t, out, "dead_letters")
	require.Contains(t, out, "slow: could not run")

	for _, bad := range [][]string{
		{"--rules", filepath.Join(t.TempDir(), "missing.yaml")},
		{"--expect=x=k@not a path:SELECT 1"},
		{"--horizon", "c=-1h"},
		{"--textfile", prom, "--interval", "1m"},
		{"--skip", "no_such_check"},
	} {
		code, _, stderr := cli(t, vars, append([]string{"drift"}, bad...)...)
		require.Equal(t, 2, code, "%v: %s", bad, stderr)
	}
}
