package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/outbox"
)

// The schema's owner creates the publication beforehand (so that the
// relay's role needs no CREATE): a publication without its slot and
// without a row in logical_slots is a slot never made, and SetUpLogical
// creates it and records it. Once recorded, the slot dropped is refused
// by SetUpLogical and seen lost by SlotStatus, the publication aside.
func TestSetUpLogicalMakesTheSlotOfAnOwnersPublicationAndRefusesItDropped(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	ctx := context.Background()
	slot := "oncekit_" + b.db.Schema
	marker := func() int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM "`+b.db.Schema+`".logical_slots WHERE slot = $1`, slot).Scan(&n))
		return n
	}
	require.Equal(t, 1, marker(), "SetUpLogical records the slot it created")

	// The state an owner leaves: the publication, no slot, no row.
	_, err := b.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM "`+b.db.Schema+`".logical_slots`)
	require.NoError(t, err)
	s := b.slotStatus(t)
	require.True(t, s.SetUp && !s.Exists && !s.Lost && s.CreatedAt == nil, "a publication alone waits for its slot: %+v", s)

	require.NoError(t, b.ob.SetUpLogical(ctx, b.db.Pool), "the publication's first slot is made")
	s = b.slotStatus(t)
	require.True(t, s.SetUp && s.Exists && !s.Lost, "%+v", s)
	require.NotNil(t, s.CreatedAt)
	require.WithinDuration(t, time.Now(), *s.CreatedAt, time.Minute)
	require.Equal(t, 1, marker())

	// Events flow through the slot so made.
	pub, _ := publisher(t, b.nats.URL)
	_, _ = b.runLogicalRelay(t, pub, outbox.LogicalRelayConfig{})
	b.streaming(t)

	// Dropped after set-up: the row says it was made, so no new slot.
	b.evictSlot(t, `SELECT pg_drop_replication_slot('`+slot+`')`)
	err = b.ob.SetUpLogical(ctx, b.db.Pool)
	require.ErrorIs(t, err, outbox.ErrSlotLost)
	var lost *outbox.SlotLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, "dropped", lost.Reason)
	require.Equal(t, s.CreatedAt.UTC(), lost.Created.UTC())
	require.Contains(t, err.Error(), `replication slot "`+slot+`" was dropped (oncekit created it on `+s.CreatedAt.UTC().Format(time.RFC3339))
	t.Logf("SetUpLogical: %v", err)
	s = b.slotStatus(t)
	require.True(t, s.Lost && !s.Exists && s.Behind(), "%+v", s)
}

// A slot set up before logical_slots existed (no row) gets its row from
// SetUpLogical, so that its drop is caught from then on.
func TestSetUpLogicalRecordsASlotMadeBeforeItsRow(t *testing.T) {
	t.Parallel()
	b := logicalSetup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `DELETE FROM "`+b.db.Schema+`".logical_slots`)
	require.NoError(t, err)
	require.Nil(t, b.slotStatus(t).CreatedAt)
	require.NoError(t, b.ob.SetUpLogical(ctx, b.db.Pool))
	s := b.slotStatus(t)
	require.True(t, s.Exists && !s.Lost && s.CreatedAt != nil, "%+v", s)
	_, err = b.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.Name)
	require.NoError(t, err)
	require.ErrorIs(t, b.ob.SetUpLogical(ctx, b.db.Pool), outbox.ErrSlotLost)
	require.True(t, b.slotStatus(t).Lost)
}
