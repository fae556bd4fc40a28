package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// writeFleetFile writes a fleet list of name → (url, schema) pairs.
func writeFleetFile(t *testing.T, entries ...[3]string) string {
	t.Helper()
	var list []map[string]string
	for _, e := range entries {
		list = append(list, map[string]string{"name": e[0], "url": e[1], "schema": e[2]})
	}
	raw, err := json.Marshal(list)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "fleet.json")
	require.NoError(t, os.WriteFile(file, raw, 0o600))
	return file
}

// `oncekit status --fleet FILE` prints a line per database: the backlog and
// leases of those that answer, and DOWN with the reason, within --timeout
// and without a credential, for one that refuses connections, one that
// hangs, one that does not exist, one whose role is refused and one
// without the migrations; the
// healthy ones are read all the same.
func TestStatusFleetLineByDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testenv.NewDB(t), testenv.NewDB(t)
	ob, err := outbox.New(&outbox.Config{Schema: a.Schema})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, a.Pool, func(tx pgx.Tx) error {
		_, err := ob.Enqueue(ctx, tx, broker.Message{ID: uuid.New(), Subject: "s", Key: "k", Payload: []byte("1")},
			broker.Message{ID: uuid.New(), Subject: "s", Key: "k", Payload: []byte("2")})
		return err
	}))
	_, err = b.Pool.Exec(ctx, `UPDATE relay_partitions SET owner = 'relay-x', token = 1, expires_at = now() + interval '1 minute'
		WHERE partition < 4`)
	require.NoError(t, err)

	with := func(raw string, edit func(u *url.URL)) string {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		edit(u)
		return u.String()
	}
	refused := "postgres://relay:S3cret@" + testenv.FreeAddr(t) + "/x?sslmode=disable"
	hangs := "postgres://relay:S3cret@" + testenv.StartBlackhole(t) + "/x?sslmode=disable"
	nodb := with(a.URL, func(u *url.URL) { u.Path = "/no_such_database_" + a.Schema })
	badRole := with(a.URL, func(u *url.URL) { u.User = url.UserPassword("no_such_role_"+a.Schema, "S3cret") })
	file := writeFleetFile(t, [3]string{"a", a.URL, a.Schema}, [3]string{"b", b.URL, b.Schema},
		[3]string{"refused", refused, ""}, [3]string{"hangs", hangs, ""},
		[3]string{"nodb", nodb, a.Schema}, [3]string{"badrole", badRole, "badrole"}, // refused before its schema is read
		[3]string{"nomigrations", a.URL, "nomigrations"})

	start := time.Now()
	code, out, stderr := cli(t, nil, "status", "--fleet", file, "--timeout", "2s")
	took := time.Since(start)
	t.Logf("took %v:\n%s", took, out)
	require.Equal(t, 1, code, "a database down: exit 1; stderr: %s", stderr)
	require.Less(t, took, 10*time.Second, "the hung database is given up on after --timeout")
	require.NotContains(t, out+stderr, "S3cret")
	require.Regexp(t, `(?m)^a +up +2 +\d+s +0 +0/16 +0`, out)
	require.Regexp(t, `(?m)^b +up +0 +- +0 +4/16 +1`, out)
	require.Regexp(t, `(?m)^refused +DOWN( +-){5} +unreachable: .*connection refused`, out)
	require.Regexp(t, `(?m)^hangs +DOWN( +-){5} +no answer within 2s`, out)
	require.Regexp(t, `(?m)^nodb +DOWN( +-){5} +\S`, out)
	require.Regexp(t, `(?m)^badrole +DOWN( +-){5} +\S`, out)
	require.Regexp(t, `(?m)^nomigrations +DOWN( +-){5} +no outbox tables in the schema: run oncekit migrate`, out)
	if !testenv.Pooled(t, testenv.DatabaseURL()) { // a pooler answers in its own words
		require.Regexp(t, `(?m)^nodb .*no such database \(SQLSTATE 3D000\)`, out)
		require.Regexp(t, `(?m)^badrole .*credentials refused \(SQLSTATE 28000\)`, out)
	}

	code, out, stderr = cli(t, nil, "status", "--fleet", file, "--timeout", "2s", "--json")
	require.Equal(t, 1, code, stderr)
	var rows []fleet.DatabaseStatus
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 7)
	require.True(t, rows[0].Up)
	require.Equal(t, int64(2), rows[0].Backlog)
	require.Positive(t, rows[0].OldestSeconds)
	require.Equal(t, 4, rows[1].Owned)
	require.Equal(t, 1, rows[1].Relays)
	for _, r := range rows[2:] {
		require.False(t, r.Up, r.Name)
		require.NotEmpty(t, r.Down, r.Name)
	}

	// Every database up: exit 0.
	code, _, stderr = cli(t, nil, "status", "--fleet", writeFleetFile(t, [3]string{"a", a.URL, a.Schema}))
	require.Equal(t, 0, code, stderr)
}

// A list naming a database twice is refused whole, naming the entry, as
// `oncekit relay --fleet` refuses it; flags of one database's status do
// not mix with --fleet.
func TestStatusFleetRefusesABadList(t *testing.T) {
	t.Parallel()
	u := "postgres://relay@127.0.0.1:1/x"
	code, _, stderr := cli(t, nil, "status", "--fleet", writeFleetFile(t, [3]string{"a", u, ""}, [3]string{"a", u + "y", ""}))
	require.Equal(t, 2, code)
	require.Regexp(t, regexp.MustCompile(`--fleet: .*"a"`), stderr)
	code, _, stderr = cli(t, nil, "status", "--fleet", writeFleetFile(t, [3]string{"a", u, ""}, [3]string{"b", u, ""}))
	require.Equal(t, 2, code, "one outbox under two names")
	require.Contains(t, stderr, "--fleet: ")
	code, _, stderr = cli(t, nil, "status", "--fleet", writeFleetFile(t, [3]string{"a", u, ""}), "--slot", "s")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--slot does not apply")
	code, _, stderr = cli(t, nil, "status", "--timeout", "1s")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--timeout needs --fleet")
}
