package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/oncekittest"
)

// The quickstart, as `go run ./examples/quickstart` runs it, in an isolated
// schema and NATS server.
func TestQuickstart(t *testing.T) {
	db := oncekittest.NewDB(t)
	n := oncekittest.NewNATS(t)
	t.Setenv("DATABASE_URL", db.URL)
	t.Setenv("ONCEKIT_SCHEMA", db.Schema)
	t.Setenv("NATS_URL", n.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out))
	t.Log("\n" + out.String())
	require.Contains(t, out.String(), "POST /payments (first) → 201 Idempotent-Replayed=\"\"")
	require.Contains(t, out.String(), "POST /payments (retry) → 201 Idempotent-Replayed=\"true\"")
	require.Contains(t, out.String(), "receipt confirmed: provider called 1 time(s)")
}
