package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/migrations"
	"github.com/oncekit/oncekit/outbox"
)

// The logical relay runs under a role of its own with the logical-relay
// grants and the REPLICATION attribute, and no CREATE: the owner made the
// publication beforehand, and the relay creates the slot at its first start
// and records it in logical_slots (a publication without a slot and
// without that record is a slot not yet made, not a dropped one).
// Producers writing into the WAL need only the producer grants.
func TestLogicalRelayRunsUnderItsOwnReplicationRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	nats := testenv.NewNATS(t)
	relayRole := grantRole(t, db, migrations.LogicalRelay)
	producer := grantRole(t, db, migrations.Producer)
	_, err := db.Pool.Exec(ctx, fmt.Sprintf(`ALTER ROLE %q REPLICATION`, relayRole.Name))
	require.NoError(t, err)
	slot := "oncekit_" + db.Schema
	_, err = db.Pool.Exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %q`, slot))
	require.NoError(t, err)
	var create bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT has_database_privilege($1, current_database(), 'CREATE')`, relayRole.Name).Scan(&create))
	require.False(t, create)

	stream := strings.ToUpper(testenv.Name(t))
	relay := startOncekit(t, roleVars(db, relayRole, nats.URL), "relay", "--logical", "--stream", stream, "--subjects", stream+".>")
	require.Eventually(t, func() bool {
		var n, recorded int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
			(SELECT count(*) FROM logical_slots WHERE slot = $1)`, slot).Scan(&n, &recorded))
		return n == 1 && recorded == 1
	}, 30*time.Second, 20*time.Millisecond, "the relay made and recorded no slot: %s", relay.out)

	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, rolePool(t, producer), func(tx pgx.Tx) error {
		var msgs []broker.Message
		for i := range 10 {
			msgs = append(msgs, broker.Message{ID: uuid.New(), Subject: stream + ".order", Key: fmt.Sprint(i % 3), Payload: []byte("{}")})
		}
		_, err := ob.Enqueue(ctx, tx, msgs...)
		return err
	}))
	var published uint64
	require.Eventually(t, func() bool {
		if s, err := nats.JS.Stream(ctx, stream); err == nil {
			if info, err := s.Info(ctx); err == nil {
				published = info.State.Msgs
			}
		}
		return published == 10
	}, 30*time.Second, 20*time.Millisecond, "the logical relay did not publish the 10 events: %s", relay.out)
}
