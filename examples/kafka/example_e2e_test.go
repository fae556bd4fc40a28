package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// The example end to end, as `go run .` runs it: kfake in the process, its
// schema, 300 events relayed to Kafka and applied by the consumer group,
// each once.
func TestExampleEndToEnd(t *testing.T) {
	t.Parallel()
	schema := testenv.Name(t)
	ctx := context.Background()
	var out bytes.Buffer
	err := run(ctx, config{Topic: "payments", DBURL: testenv.DatabaseURL(), Schema: schema, Events: 300, Logger: quiet}, &out)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), testenv.DatabaseURL())
		if err == nil {
			_, _ = conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			_ = conn.Close(context.Background())
		}
	})
	t.Log(out.String())
	require.NoError(t, err)
	require.Contains(t, out.String(), "applied 300 invoices (300 distinct events)")
}
