package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

func TestDLQUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq"}, "missing subcommand"},
		{[]string{"dlq", "bogus"}, "unknown subcommand"},
		{[]string{"dlq", "show"}, "at least one dead letter ID"},
		{[]string{"dlq", "replay", "x1"}, "is not a dead letter ID"},
		{[]string{"dlq", "prune"}, "say what to delete"},
		{[]string{"dlq", "purge"}, "say what to delete"}, // the former name
		{[]string{"dlq", "list", "--schema", "Bad-Schema"}, "--schema"},
		{[]string{"dlq", "list"}, "--database-url"},
	} {
		var stdout, stderr bytes.Buffer
		e := &env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		code := run(context.Background(), e, tc.args)
		require.Equal(t, 2, code, "%v: %s", tc.args, stderr.String())
		require.Contains(t, stderr.String(), tc.want, "%v", tc.args)
	}
}

func TestDLQHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
	require.Equal(t, 0, run(context.Background(), e, []string{"dlq", "-h"}))
	require.Contains(t, stderr.String(), "replay ID...")
}

// What a broker or a provider sent reaches the operator's terminal as text:
// escape sequences in a dead letter's ID, subject, headers, reason and
// payload, an effect's provider text and an outbox row's subject are
// printed escaped by the tables and `dlq show`.
func TestTablesEscapeControlCharacters(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	const esc = "\x1b]0;pwned\x07\x1b[2J"
	store, err := inbox.NewStore(db.Schema)
	require.NoError(t, err)
	_, err = store.InsertDeadLetter(ctx, db.Pool, inbox.DeadLetter{Consumer: "c", MessageID: "id" + esc, Subject: "s" + esc,
		Payload: []byte("body" + esc), Headers: map[string][]string{"X" + esc: {"v" + esc}}, Reason: "r" + esc, Attempts: 1})
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO side_effects (source_id, kind, payload, idempotency_key, state, last_error)
		VALUES ('src'||$1, 'k', '', 'key', 'failed', 'provider said '||$1)`, esc)
	require.NoError(t, err)
	for _, args := range [][]string{{"dlq", "list"}, {"dlq", "show", "1"}, {"effects", "list"}} {
		code, stdout, stderr := cli(t, dbVars(db), args...)
		require.Zero(t, code, stderr)
		require.NotContains(t, stdout, "\x1b", "%v printed an escape sequence", args)
		require.Contains(t, stdout, `\x1b]0;pwned\x07`, "%v", args)
	}
}
