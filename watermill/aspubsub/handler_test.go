package aspubsub_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/watermill/aspubsub"
)

// The inbox on watermill-sql (PostgreSQL as the broker): a republished copy
// is a duplicate, a failing handler is redelivered and processed once,
// permanent failures and ID-less messages become dead letters.
func TestWatermillSQLSubscriber(t *testing.T) {
	t.Parallel()
	testenv.RequireDirect(t, "watermill-sql's publisher sends its JSON payload as bytea, which PostgreSQL refuses as JSON in pgx's exec mode")
	db := testenv.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE effects (message_id uuid NOT NULL, payload text NOT NULL)`)
	require.NoError(t, err)
	sqlDB, err := sql.Open("pgx", db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })

	logger := watermill.NopLogger{}
	pub, err := wmsql.NewPublisher(sqlDB, wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, logger)
	require.NoError(t, err)
	sub, err := wmsql.NewSubscriber(sqlDB, wmsql.SubscriberConfig{
		SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     20 * time.Millisecond,
		ResendInterval:   50 * time.Millisecond,
	}, logger)
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	in, err := aspubsub.New(db.Pool, &aspubsub.Config{Name: "billing", Schema: db.Schema, Registerer: reg})
	require.NoError(t, err)
	var flakyCalls atomic.Int32
	h := in.NoPublishHandler(func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
		id, err := aspubsub.DefaultMessageID(msg)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, payload) VALUES ($1, $2)`, id, string(msg.Payload)); err != nil {
			return err
		}
		switch string(msg.Payload) {
		case `"flaky"`:
			if flakyCalls.Add(1) == 1 {
				return errors.New("downstream not ready")
			}
		case `"poison"`:
			return inbox.Permanent(errors.New("cannot decode"))
		}
		return nil
	})
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	topic := "payments"
	router.AddNoPublisherHandler("billing", topic, sub, h)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- router.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-router.Running()

	event := uuid.New()
	newMsg := func(payload string, eventID string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		if eventID != "" {
			m.Metadata.Set(broker.HeaderEventID, eventID)
		}
		return m
	}
	original := newMsg(`"paid"`, event.String())
	republished := newMsg(`"paid"`, event.String()) // a new watermill UUID and offset
	flaky := newMsg(`"flaky"`, uuid.NewString())
	poison := newMsg(`"poison"`, uuid.NewString())
	noID := newMsg(`"anonymous"`, "")
	noID.UUID = "not-a-uuid"
	require.NoError(t, pub.Publish(topic, original, republished, flaky, poison, noID))

	require.Eventually(t, func() bool {
		s := in.Stats()
		return s.Processed == 2 && s.Duplicates == 1 && s.DeadLettered == 2
	}, 30*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 1, in.Stats().Failed, "the flaky handler failed once")
	require.EqualValues(t, 2, flakyCalls.Load())

	// The same series an inbox.Consumer reports.
	series := func(name string, labels ...string) float64 {
		return testenv.Metric(t, reg, "oncekit_inbox_"+name, append([]string{"consumer", "billing"}, labels...)...)
	}
	require.EqualValues(t, 2, series("processed_total"))
	require.EqualValues(t, 1, series("duplicates_total"))
	require.EqualValues(t, 1, series("retried_total"))
	require.EqualValues(t, 1, series("dead_lettered_total", "reason", "permanent"))
	require.EqualValues(t, 1, series("dead_lettered_total", "reason", "invalid_id"))
	require.EqualValues(t, 4, series("handler_seconds"), "paid, flaky twice, poison")
	require.InDelta(t, 1.0/3, series("dedup_hit_ratio"), 1e-9)

	var n, paid, flakyN int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE message_id = $1), count(*) FILTER (WHERE payload = '"flaky"') FROM effects`, event).Scan(&n, &paid, &flakyN))
	require.Equal(t, 2, n)
	require.Equal(t, 1, paid, "the republished copy was a duplicate")
	require.Equal(t, 1, flakyN, "the failed attempt rolled back")

	var reasons []string
	rows, err := db.Pool.Query(ctx, `SELECT reason FROM dead_letters WHERE consumer = 'billing' ORDER BY reason`)
	require.NoError(t, err)
	reasons, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{`aspubsub: message has no valid ID: "not-a-uuid"`, "permanent: cannot decode"}, reasons)
	var claims int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_messages WHERE consumer = 'billing'`).Scan(&claims))
	require.Equal(t, 2, claims, "dead letters leave no claim")
}
