package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/oncekittest"
)

// The whole chain, as `make demo` runs it, in an isolated schema and NATS.
func TestChainEndToEnd(t *testing.T) {
	db := oncekittest.NewDB(t)
	n := oncekittest.NewNATS(t)
	t.Setenv("ONCEKIT_SCHEMA", db.Schema)
	t.Setenv("NATS_URL", n.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, run(ctx))
}
