package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The demo, as `make demo` runs it, in a schema of its own; NATS is the
// embedded fallback unless NATS_URL names a server.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "payments_test_" + hex.EncodeToString(b[:])
	cfg, _, err := parseConfig("demo", []string{"-schema", schema}, os.Stderr)
	require.NoError(t, err)
	if os.Getenv("NATS_URL") == "" {
		cfg.NATSURL = "nats://127.0.0.1:1" // nothing listens: the demo embeds a server
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), cfg.DatabaseURL)
		if err == nil {
			_, _ = conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
			_ = conn.Close(context.Background())
		}
	})
	require.NoError(t, runDemo(ctx, cfg, nil))
}

// Bad flags are a usage error (exit 2), and help never shows the
// environment's database URL.
func TestConfigUsage(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://app:S3cret@db.internal/app")
	var help strings.Builder
	_, _, err := parseConfig("api", []string{"-h"}, &help)
	require.ErrorContains(t, err, "help requested")
	require.NotContains(t, help.String(), "S3cret")
	require.Contains(t, help.String(), "-listen")

	for _, args := range [][]string{{"-schema", "Bad-Name"}, {"-fail-rate", "2"}} {
		_, _, err := parseConfig("provider", args, &help)
		require.Error(t, err, "%v", args)
	}
	require.ErrorAs(t, dispatchRole(context.Background(), []string{"nope"}, &help), new(usageError))
}
