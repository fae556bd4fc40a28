package main

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// cli runs the oncekit command line in-process with vars as its whole
// environment.
func cli(t *testing.T, vars map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return vars[k] }}
	code = run(context.Background(), e, args)
	return code, out.String(), errb.String()
}

// dbVars is the environment of a command run against db.
func dbVars(db *testenv.DB) map[string]string {
	return map[string]string{"DATABASE_URL": db.URL, "ONCEKIT_SCHEMA": db.Schema}
}

// secretVars hold a credential in every variable that may carry one.
var secretVars = map[string]string{
	"DATABASE_URL":           "postgres://app:S3cret@127.0.0.1:1/app?sslmode=disable",
	"NATS_URL":               "nats://app:S3cret@127.0.0.1:1",
	"ONCEKIT_WEBHOOK_SECRET": "whsec_UzNjcmV0UzNjcmV0UzNjcmV0UzNjcmV0",
}

func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func TestEveryCommandHasHelp(t *testing.T) {
	t.Parallel()
	for _, name := range commandNames() {
		for _, h := range []string{"-h", "--help"} {
			code, stdout, stderr := cli(t, nil, name, h)
			require.Equal(t, 0, code, "%s %s: %s", name, h, stderr)
			require.Contains(t, stdout+stderr, "usage: oncekit "+name, "%s %s", name, h)
		}
	}
}

func TestHelpNeverPrintsCredentials(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"ONCEKIT_SCHEMA": "env_schema_marker", "ONCEKIT_LISTEN": "127.0.0.9:4711",
		"ONCEKIT_PARTITIONS": "4711", "USER": "env_user_marker"}
	for k, v := range secretVars {
		vars[k] = v
	}
	var args [][]string
	for _, name := range commandNames() {
		args = append(args, []string{name, "-h"})
	}
	args = append(args, []string{"effects", "list", "-h"}, []string{"effects", "retry", "-h"}, []string{"dlq", "list", "-h"},
		[]string{"outbox", "list", "-h"}, []string{"migrate", "up", "-h"})
	for _, a := range args {
		code, stdout, stderr := cli(t, vars, a...)
		require.Equal(t, 0, code, "%v: %s", a, stderr)
		require.NotContains(t, stdout+stderr, "S3cret", "%v", a)
		require.NotContains(t, stdout+stderr, "UzNjcmV0", "%v", a)
		for _, v := range []string{"env_schema_marker", "4711", "env_user_marker"} {
			require.NotContains(t, stdout+stderr, v, "%v: help shows a value from the environment", a)
		}
	}
}

func TestErrorsNeverPrintCredentials(t *testing.T) {
	t.Parallel()
	for _, a := range [][]string{
		{"drift"},
		{"status"},
		{"outbox", "list"},
		{"relay"},
		{"dlq", "list"},
		{"migrate", "up", "--database-url", "postgres://app:S3cret@127.0.0.1:1/app"},
		{"migrate", "status", "--database-url", "host=127.0.0.1 port=1 user=app password=S3cret"},
		{"migrate", "up", "--database-url", "postgres://app:S3cret@127.0.0.1:1/app?sslmode=bogus"},
	} {
		code, stdout, stderr := cli(t, secretVars, a...)
		require.NotEqual(t, 0, code, "%v", a)
		require.NotContains(t, stdout+stderr, "S3cret", "%v", a)
	}
	// PostgreSQL reachable, NATS not: the NATS URL's password stays hidden.
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO dead_letters (consumer, message_id, subject, payload, reason, attempts)
		VALUES ('c', 'm', 's', '', 'poison', 1)`)
	require.NoError(t, err)
	vars := dbVars(db)
	vars["NATS_URL"] = secretVars["NATS_URL"]
	code, stdout, stderr := cli(t, vars, "dlq", "replay", "1")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "NATS at nats://app:xxxxx@127.0.0.1:1 is unreachable")
	require.NotContains(t, stdout+stderr, "S3cret")

	require.Equal(t, "nats://app:xxxxx@127.0.0.1:1", redact("nats://app:S3cret@127.0.0.1:1"))
	require.Equal(t, "dial postgres://app:xxxxx@h/db and host=h password=xxxxx user=u",
		redact("dial postgres://app:S3cret@h/db and host=h password=S3cret user=u"))
}

func TestUnknownFlagIsReportedOnce(t *testing.T) {
	t.Parallel()
	for _, a := range [][]string{{"relay", "--bogus"}, {"drift", "--bogus"}, {"effects", "list", "--bogus"}, {"outbox", "list", "--bogus"}} {
		code, stdout, stderr := cli(t, nil, a...)
		require.Equal(t, 2, code, "%v", a)
		require.Equal(t, 1, strings.Count(stdout+stderr, "-bogus"), "%v: %s", a, stderr)
	}
}

func TestBadValuesAreUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "list", "--state", "bogus"}, `--state "bogus": want pending, parked or published`},
		{[]string{"effects", "list", "--state", "nope"}, `--state "nope"`},
		{[]string{"drift", "--max-outbox-age", "-5s"}, "--max-outbox-age"},
		{[]string{"drift", "--lease-grace", "-1s"}, "--lease-grace"},
		{[]string{"drift", "--check-timeout", "-1s"}, "--check-timeout"},
		{[]string{"migrate", "up", "--schema", ""}, "--schema"},
		{[]string{"outbox", "list", "--limit", "-3"}, "--limit"},
		{[]string{"relay", "--lease", "-1s"}, "--lease"},
		{[]string{"dispatch", "--endpoint", "k=https://x", "--secret", "nope!"}, "Config.Secret"},
		// An unknown subcommand is named before anything else is checked.
		{[]string{"migrate", "bogus", "x"}, `unknown subcommand "bogus": want up, status, sql or grant`},
		{[]string{"outbox", "bogus", "--limit", "0"}, `unknown subcommand "bogus": want list, parked, unpark, rebase or repartition`},
		{[]string{"dlq", "bogus", "x1"}, `unknown subcommand "bogus": want list, show, replay or prune`},
		{[]string{"effects", "bogus"}, `unknown subcommand "bogus": want list, retry, resolve or prune`},
	} {
		code, _, stderr := cli(t, secretVars, tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.NotContains(t, stderr, "outbox.State", "%v", tc.args)
		require.Equal(t, 1, strings.Count(stderr, "webhook:")+boolInt(!strings.Contains(stderr, "webhook:")), "%v: %s", tc.args, stderr)
	}
}

func TestMigrateSQLNeedsNoDatabase(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := cli(t, map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x"}, "migrate", "sql", "--schema", "elsewhere")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `CREATE TABLE "elsewhere".outbox (`)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestDatabaseProblemsAreNamed(t *testing.T) {
	t.Parallel()
	base := testenv.DatabaseURL()
	other := func(find, repl string) string { return strings.Replace(base, find, repl, 1) }

	code, _, stderr := cli(t, map[string]string{"DATABASE_URL": other("/postgres?", "/no_such_db_oncekit?")}, "outbox", "list")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `database "no_such_db_oncekit" does not exist`)
	require.NotContains(t, stderr, "unreachable")

	code, _, stderr = cli(t, map[string]string{"DATABASE_URL": other("postgres@", "no_such_role_oncekit@")}, "outbox", "list")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `role "no_such_role_oncekit"`)
	require.NotContains(t, stderr, "unreachable")

	code, _, stderr = cli(t, map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x"}, "outbox", "list")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "unreachable")

	// A schema without oncekit's tables: every command says to migrate.
	missing := map[string]string{"DATABASE_URL": base, "ONCEKIT_SCHEMA": "no_such_schema_oncekit"}
	for _, a := range [][]string{
		{"outbox", "list"}, {"effects", "list"}, {"dlq", "list"}, {"status"},
	} {
		code, _, stderr := cli(t, missing, a...)
		require.Equal(t, 1, code, "%v: %s", a, stderr)
		require.Contains(t, stderr, "run `oncekit migrate up --schema no_such_schema_oncekit` first", "%v", a)
		require.NotContains(t, stderr, "does not exist (SQLSTATE", "%v", a)
	}
	code, _, stderr = cli(t, missing, "drift")
	require.Equal(t, exitCheckError, code, stderr)
	require.Contains(t, stderr, "run `oncekit migrate up --schema no_such_schema_oncekit` first")
}

func TestDriftExitsThreeWhenPostgresIsUnreachable(t *testing.T) {
	t.Parallel()
	code, _, stderr := cli(t, map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?connect_timeout=2"}, "drift")
	require.Equal(t, exitCheckError, code, stderr)
	require.Contains(t, stderr, "unreachable")
}

func TestOperationalListenersDefaultToLoopback(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"dispatch", "drift", "relay"} {
		_, _, stderr := cli(t, nil, name, "-h")
		for _, line := range strings.Split(stderr, "\n") {
			if strings.Contains(line, "default \":") {
				t.Errorf("%s: a listener defaults to every interface: %s", name, line)
			}
		}
	}
	_, _, stderr := cli(t, nil, "dispatch", "-h")
	require.Contains(t, stderr, `"127.0.0.1:9465"`)
}

func TestEmptyListsAndJSON(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	vars := dbVars(db)
	for _, a := range [][]string{{"outbox", "list"}, {"effects", "list"}, {"dlq", "list"}} {
		code, stdout, stderr := cli(t, vars, append(a, "--json")...)
		require.Equal(t, 0, code, "%v: %s", a, stderr)
		require.Equal(t, "[]\n", stdout, "%v", a)
		code, stdout, stderr = cli(t, vars, a...)
		require.Equal(t, 0, code, "%v: %s", a, stderr)
		require.Equal(t, "(none)\n", stdout, "%v", a)
	}

	exec := func(sql string) {
		_, err := db.Pool.Exec(context.Background(), sql)
		require.NoError(t, err)
	}
	exec(`INSERT INTO side_effects (source_id, kind, idempotency_key, payload) VALUES ('p1', 'mail', 'k', '{"to":"a@b"}')`)
	exec(`INSERT INTO dead_letters (consumer, message_id, subject, payload, headers, reason, attempts)
		VALUES ('c', 'm', 's', '{"n":1}', '{"A":["b"]}', 'poison', 3), ('c', 'm2', 's', '\xff00', '{}', 'binary', 1)`)
	exec(`INSERT INTO outbox (id, partition, subject, payload) VALUES ('0b6f6c1c-92f5-4b8f-8f5e-7d2f2c1f1a01', 0, 'a.b', '{"x":true}')`)

	var effects []map[string]any
	code, stdout, stderr := cli(t, vars, "effects", "list", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &effects), stdout)
	require.Len(t, effects, 1)
	require.Equal(t, "p1", effects[0]["source_id"])
	require.Equal(t, map[string]any{"to": "a@b"}, effects[0]["payload"])
	require.NotContains(t, effects[0], "SourceID")

	var dls []map[string]any
	code, stdout, stderr = cli(t, vars, "dlq", "list", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &dls), stdout)
	require.Len(t, dls, 2)
	require.Equal(t, map[string]any{"n": float64(1)}, dls[0]["payload"])
	require.Equal(t, "/wA=", dls[1]["payload_base64"])
	require.Equal(t, "m", dls[0]["message_id"])

	var rows []map[string]any
	code, stdout, stderr = cli(t, vars, "outbox", "list", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows), stdout)
	require.Len(t, rows, 1)
	require.Equal(t, "pending", rows[0]["state"])
	require.Equal(t, "a.b", rows[0]["subject"])
}

func TestConfigErrorsNameTheFlag(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	vars := dbVars(db)
	vars["NATS_URL"] = testenv.NewNATS(t).URL
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--batch", "-1"}, "oncekit relay: --batch: -1 is negative"},
		{[]string{"relay", "--lease", "1ms"}, "oncekit relay: --lease: 1ms is below 300ms"},
		{[]string{"dispatch", "--endpoint", "k=http://127.0.0.1:1", "--unsigned", "--concurrency", "-1"}, "oncekit dispatch: --concurrency: -1 is negative"},
	} {
		code, _, stderr := cli(t, vars, tc.args...)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.NotContains(t, stderr, "Config.", "%v", tc.args)
	}
}
