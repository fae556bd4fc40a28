package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/watermill/asbroker"
)

// replaySecretVars are secretVars plus the replay brokers' URLs, each with
// a password.
func replaySecretVars() map[string]string {
	vars := map[string]string{
		"AMQP_URL":  "amqp://app:S3cret@127.0.0.1:1/",
		"REDIS_URL": "redis://app:S3cret@127.0.0.1:1/0",
	}
	for k, v := range secretVars {
		vars[k] = v
	}
	return vars
}

// Choosing the replay broker wrongly is a usage error (exit 2) with a plain
// message, before anything is opened, and never shows a URL's password.
func TestDLQReplayBrokerUsage(t *testing.T) {
	t.Parallel()
	noURLs := map[string]string{}
	for _, tc := range []struct {
		vars map[string]string
		args []string
		want string
	}{
		{noURLs, []string{"--broker", "kafka"}, `--broker "kafka": want nats, rabbitmq or redis`},
		{noURLs, []string{"--broker", "rabbitmq"}, "--broker rabbitmq needs --amqp-url (or AMQP_URL)"},
		{noURLs, []string{"--broker", "redis"}, "--broker redis needs --redis-url (or REDIS_URL)"},
		{noURLs, []string{"--amqp-url", "amqp://app:S3cret@h/"}, "--amqp-url is for --broker rabbitmq, and the broker is nats"},
		{noURLs, []string{"--broker", "redis", "--amqp-url", "amqp://app:S3cret@h/"}, "--amqp-url is for --broker rabbitmq, and the broker is redis"},
		{noURLs, []string{"--broker", "rabbitmq", "--redis-url", "redis://:S3cret@h/0"}, "--redis-url is for --broker redis, and the broker is rabbitmq"},
		{noURLs, []string{"--broker", "redis", "--nats-url", "nats://app:S3cret@h"}, "--nats-url is for --broker nats, and the broker is redis"},
		{noURLs, []string{"--broker", "rabbitmq", "--amqp-url", "http://app:S3cret@h/"}, "--amqp-url: not an amqp:// or amqps:// URL"},
		{noURLs, []string{"--broker", "redis", "--redis-url", "redis://app:S3cret@h:6379/db"}, "--redis-url: not a redis:// or rediss:// URL"},
		{map[string]string{"AMQP_URL": "amqp://app:S3cret@h:port/"}, []string{"--broker", "rabbitmq"}, "--amqp-url: not an amqp:// or amqps:// URL"},
	} {
		args := append(append([]string{"dlq", "replay"}, tc.args...), "1")
		code, stdout, stderr := cli(t, tc.vars, args...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.Equal(t, "oncekit dlq: "+tc.want+"\n", stderr, "%v", args)
		require.Empty(t, stdout, "%v", args)
	}

	code, stdout, stderr := cli(t, replaySecretVars(), "dlq", "replay", "-h")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "-broker BROKER")
	require.Contains(t, stderr, "-amqp-url URL")
	require.Contains(t, stderr, "-redis-url URL")
	require.NotContains(t, stdout+stderr, "S3cret")
	require.NotContains(t, stdout+stderr, "127.0.0.1:1", "help shows no value from the environment")
}

// insertDeadLetter stores a dead letter for subject with an event ID, a key
// and two application headers, and returns its ID and event ID.
func insertDeadLetter(t *testing.T, db *testenv.DB, subject string) (int64, uuid.UUID) {
	t.Helper()
	id := uuid.New()
	headers, err := json.Marshal(map[string][]string{
		broker.HeaderEventID: {id.String()},
		broker.HeaderKey:     {"order-7"},
		"X-Tenant":           {"acme"},
		"traceparent":        {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	})
	require.NoError(t, err)
	var n int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `INSERT INTO dead_letters (consumer, message_id, subject, payload, headers, reason, attempts)
		VALUES ('billing', $1, $2, '{"n":1}', $3, 'poison', 5) RETURNING id`, id.String(), subject, headers).Scan(&n))
	return n, id
}

// A broker that is unreachable, or that refuses the login, is reported
// with the URL's password hidden, exit 1, and the dead letter stays
// pending.
func TestDLQReplayBrokerErrorsHidePassword(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	n, _ := insertDeadLetter(t, db, "orders")
	rabbit := strings.Replace(testenv.RabbitMQURL(t), "guest:guest@", "guest:S3cretWrong@", 1)
	require.Contains(t, rabbit, "S3cretWrong", "RABBITMQ_URL has guest:guest")
	redisURL := "redis://app:S3cretWrong@" + testenv.RedisAddr(t) + "/0"
	for _, tc := range []struct{ broker, url, want string }{
		{"rabbitmq", "amqp://app:S3cret@127.0.0.1:1/", "connect to RabbitMQ at amqp://app:xxxxx@127.0.0.1:1/: "},
		{"redis", "redis://app:S3cret@127.0.0.1:1/0", "connect to Redis at redis://app:xxxxx@127.0.0.1:1/0: "},
		{"rabbitmq", rabbit, "connect to RabbitMQ at amqp://guest:xxxxx@"}, // the real server refuses the password
		{"redis", redisURL, "connect to Redis at redis://app:xxxxx@"},
	} {
		vars := dbVars(db)
		vars[map[string]string{"rabbitmq": "AMQP_URL", "redis": "REDIS_URL"}[tc.broker]] = tc.url
		code, stdout, stderr := cli(t, vars, "dlq", "replay", "--broker", tc.broker, fmt.Sprint(n))
		require.Equal(t, 1, code, "%s: %s", tc.broker, stderr)
		require.Contains(t, stderr, tc.want)
		require.NotContains(t, stdout+stderr, "S3cret", tc.broker)
	}
	store, err := inbox.NewStore(db.Schema)
	require.NoError(t, err)
	dl, err := store.GetDeadLetter(context.Background(), db.Pool, n)
	require.NoError(t, err)
	require.Nil(t, dl.ReplayedAt)
}

// replayTarget is a queue or stream on a real broker that a consumer reads
// through asbroker, as an oncekit consumer on that broker does.
type replayTarget struct {
	vars map[string]string // the broker's URL variable
	dest string
	src  broker.Source
}

func newReplayTarget(t *testing.T, kind string) replayTarget {
	t.Helper()
	dest := testenv.Name(t)
	var sub message.Subscriber
	var vars map[string]string
	switch kind {
	case brokerRabbitMQ:
		uri := testenv.RabbitMQURL(t)
		vars = map[string]string{"AMQP_URL": uri}
		conn, err := amqp091.Dial(uri)
		require.NoError(t, err)
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDeclare(dest, true, false, false, false, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = ch.QueueDelete(dest, false, false, false); _ = conn.Close() })
		cfg := amqp.NewDurableQueueConfig(uri)
		sub, err = amqp.NewSubscriber(cfg, watermill.NopLogger{})
		require.NoError(t, err)
	default:
		addr := testenv.RedisAddr(t)
		vars = map[string]string{"REDIS_URL": "redis://" + addr + "/0"}
		client := redis.NewClient(&redis.Options{Addr: addr})
		require.NoError(t, client.XGroupCreateMkStream(context.Background(), dest, "g", "0").Err())
		t.Cleanup(func() { _ = client.Del(context.Background(), dest).Err(); _ = client.Close() })
		var err error
		sub, err = redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client: redis.NewClient(&redis.Options{Addr: addr}), ConsumerGroup: "g", Consumer: "c1",
			BlockTime: 50 * time.Millisecond, DisableIndefiniteInitialBlock: true,
		}, watermill.NopLogger{})
		require.NoError(t, err)
	}
	src, err := asbroker.NewSource(context.Background(), sub, &asbroker.SourceConfig{Topics: []string{dest}})
	require.NoError(t, err)
	t.Cleanup(func() { src.Close(); _ = sub.Close() })
	return replayTarget{vars: vars, dest: dest, src: src}
}

// `oncekit dlq replay --broker rabbitmq|redis` publishes a dead letter to
// the real broker: a consumer of the queue or stream receives it with its
// event ID, key, headers and payload, and the dead letter is marked
// replayed. A dead letter whose queue or stream is gone is not published
// and stays pending.
func TestDLQReplayToWatermillBrokers(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{brokerRabbitMQ, brokerRedis} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.NewDB(t)
			target := newReplayTarget(t, kind)
			n, id := insertDeadLetter(t, db, target.dest)
			vars := dbVars(db)
			for k, v := range target.vars {
				vars[k] = v
			}

			code, stdout, stderr := cli(t, vars, "dlq", "replay", "--broker", kind, fmt.Sprint(n))
			require.Equal(t, 0, code, stderr)
			require.Equal(t, fmt.Sprintf("replayed %d (message %s) to %s on %s\n", n, id, target.dest, brokerName(kind)), stdout)

			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			ds, err := target.src.Receive(rctx, 1)
			require.NoError(t, err)
			require.Len(t, ds, 1)
			d := ds[0]
			require.Equal(t, `{"n":1}`, string(d.Data()))
			require.Equal(t, id.String(), d.Header(broker.HeaderEventID))
			require.Equal(t, "order-7", d.Header(broker.HeaderKey))
			require.Equal(t, "acme", d.Header("X-Tenant"))
			require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", d.Header("traceparent"))
			require.NoError(t, d.Ack(ctx))

			store, err := inbox.NewStore(db.Schema)
			require.NoError(t, err)
			dl, err := store.GetDeadLetter(ctx, db.Pool, n)
			require.NoError(t, err)
			require.NotNil(t, dl.ReplayedAt, "marked replayed")

			// A destination the broker does not have: nothing is
			// published, the dead letter stays pending, exit 1.
			gone, _ := insertDeadLetter(t, db, target.dest+"_gone")
			code, _, stderr = cli(t, vars, "dlq", "replay", "--broker", kind, fmt.Sprint(gone))
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, "has no "+map[string]string{brokerRabbitMQ: "queue", brokerRedis: "stream"}[kind])
			require.True(t, strings.HasPrefix(stderr, "oncekit dlq: dead letter "), stderr)
			dl, err = store.GetDeadLetter(ctx, db.Pool, gone)
			require.NoError(t, err)
			require.Nil(t, dl.ReplayedAt, "not marked replayed")
		})
	}
}
