package inbox_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
)

// Migration 006 re-keys processed_messages on (message_id, consumer): claims
// made before it still make their messages duplicates after it, for their
// consumer only, and the key leads with the event ID.
func TestClaimsSurviveTheKeyOrderMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDBAt(t, 5)
	store, err := inbox.NewStore(db.Schema)
	require.NoError(t, err)
	before := uuid.New()
	claimed, err := store.Claim(ctx, db.Pool, "billing", before)
	require.NoError(t, err)
	require.True(t, claimed)

	_, err = migrations.Up(ctx, db.Pool, migrations.WithSchema(db.Schema))
	require.NoError(t, err)

	var key string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_indexdef(conindid) FROM pg_constraint
		WHERE conrelid = 'processed_messages'::regclass AND contype = 'p'`).Scan(&key))
	require.Contains(t, key, "(message_id, consumer)")

	for _, c := range []struct {
		consumer string
		id       uuid.UUID
		want     bool
	}{
		{"billing", before, false}, // claimed before the migration: a duplicate
		{"shipping", before, true}, // the same event, another consumer
		{"billing", uuid.New(), true},
	} {
		claimed, err := store.Claim(ctx, db.Pool, c.consumer, c.id)
		require.NoError(t, err)
		require.Equal(t, c.want, claimed, "%s %s", c.consumer, c.id)
	}
}
