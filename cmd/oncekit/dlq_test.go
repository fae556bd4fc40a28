package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
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
