package sqsbroker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/examples/sqs/fauxqs"
	"github.com/oncekit/oncekit/examples/sqs/sqsbroker"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/oncekittest"
	"github.com/oncekit/oncekit/outbox"
)

// relayConfig parks a message after two failed publishes, retried quickly.
var relayConfig = &outbox.RelayConfig{
	MaxAttempts: 2, MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Lease: time.Second,
	Logger: slog.New(slog.DiscardHandler),
}

// until polls cond every 50 ms until it holds, failing tb after a minute.
func until(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			tb.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
	}
}

// enqueue writes msgs into ob's outbox in one transaction.
func enqueue(t *testing.T, db *oncekittest.DB, ob *outbox.Outbox, msgs ...broker.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = ob.Enqueue(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func message(subject, key string, payload []byte) broker.Message {
	return broker.Message{ID: uuid.New(), Subject: subject, Key: key, Payload: payload}
}

// receiveIDs receives from src until it has the event IDs want, acking
// each delivery, and fails on any other.
func receiveIDs(t *testing.T, src broker.Source, want ...uuid.UUID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	left := map[string]bool{}
	for _, id := range want {
		left[id.String()] = true
	}
	for len(left) > 0 {
		ds, err := src.Receive(ctx, 10)
		require.NoError(t, err, "still waiting for %v", left)
		for _, d := range ds {
			id := d.Header(broker.HeaderEventID)
			require.True(t, left[id], "unexpected delivery %s", id)
			delete(left, id)
			require.NoError(t, d.Ack(ctx))
		}
	}
}

// A missing queue: the consumer refuses to start with ErrQueueMissing; a
// message published to it fails on its own while SQS is reachable, so the
// relay parks it after MaxAttempts and publishes the others; once the
// queue exists, the unparked message is delivered.
func TestQueueMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := fauxqs.Shared(t).Client()
	queue := fauxqs.NewQueue(t, client, false, nil)
	missing := queue + "-later"

	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: missing, Subject: "later"})
	require.NoError(t, err)
	_, err = src.Limits(ctx)
	require.ErrorIs(t, err, sqsbroker.ErrQueueMissing)
	db := oncekittest.NewDB(t)
	c, err := inbox.NewConsumer(db.Pool, src, inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Message) error { return nil }),
		&inbox.Config{Name: "billing", Schema: db.Schema})
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = c.Run(runCtx)
	require.ErrorIs(t, err, sqsbroker.ErrQueueMissing, "Run refuses to start")
	t.Logf("consumer on a missing queue: %v", err)

	pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{QueueURL: func(s string) string {
		if s == "later" {
			return missing
		}
		return queue
	}})
	require.NoError(t, err)
	res := pub.Publish(ctx, []broker.Message{message("later", "", []byte("a"))})
	require.ErrorIs(t, res[0].Err, sqsbroker.ErrQueueMissing)
	require.True(t, pub.Connected(), "SQS answered: the failure is the message's")
	t.Logf("publish to a missing queue: %v", res[0].Err)

	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	lost, kept := message("later", "k1", []byte("to the missing queue")), message("orders", "k2", []byte("to the queue"))
	enqueue(t, db, ob, lost, kept)
	relay, err := outbox.NewRelay(db.Pool, ob, pub, relayConfig)
	require.NoError(t, err)
	stop := oncekittest.Start(t, relay.Run)
	until(t, "the message to the missing queue to be parked", func() bool {
		parked, n, err := ob.Parked(ctx, db.Pool, 10)
		require.NoError(t, err)
		return n == 1 && parked[0].ID == lost.ID && parked[0].Attempts == 2
	})
	good, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders", WaitTime: time.Second})
	require.NoError(t, err)
	defer good.Close()
	receiveIDs(t, good, kept.ID)

	// Nothing lost: the queue created, the parked message unparked goes.
	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(missing[strings.LastIndex(missing, "/")+1:])})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(missing)})
	})
	n, err := ob.Unpark(ctx, db.Pool, lost.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	later, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: missing, Subject: "later", WaitTime: time.Second})
	require.NoError(t, err)
	defer later.Close()
	receiveIDs(t, later, lost.ID)
	stop()
}

// sizes records the bytes of each SendMessageBatch call.
type sizes struct {
	sqsbroker.API
	mu    sync.Mutex
	calls []int
}

func (s *sizes) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	n := 0
	for _, e := range in.Entries {
		n += len(aws.ToString(e.MessageBody))
		for k, a := range e.MessageAttributes {
			n += len(k) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue))
		}
	}
	s.mu.Lock()
	s.calls = append(s.calls, n)
	s.mu.Unlock()
	return s.API.SendMessageBatch(ctx, in, opts...)
}

// A message over the queue's 256 KiB: refused on its own before the call
// (ErrTooLarge), or by SQS when the publisher is told a larger maximum;
// the relay parks it after MaxAttempts and publishes the rest. Messages
// that fit are sent in calls of at most 256 KiB in all, which SQS requires
// of a batch.
func TestMessageOverSizeLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := fauxqs.Shared(t).Client()
	queue := fauxqs.NewQueue(t, client, false, map[string]string{"MaximumMessageSize": "262144"})
	api := &sizes{API: client}
	pub, err := sqsbroker.NewPublisher(api, sqsbroker.PublisherConfig{QueueURL: func(string) string { return queue }})
	require.NoError(t, err)

	big := message("orders", "k0", []byte(strings.Repeat("x", 300<<10)))
	msgs := []broker.Message{big}
	for i := range 10 {
		msgs = append(msgs, message("orders", fmt.Sprint("k", i+1), []byte(strings.Repeat("y", 100<<10))))
	}
	res := pub.Publish(ctx, msgs)
	require.ErrorIs(t, res[0].Err, sqsbroker.ErrTooLarge)
	t.Logf("over the limit: %v", res[0].Err)
	for _, r := range res[1:] {
		require.NoError(t, r.Err)
	}
	require.Len(t, api.calls, 5, "ten messages of 100 KiB in calls of two")
	for _, n := range api.calls {
		require.LessOrEqual(t, n, sqsbroker.DefaultMaxMessageSize)
	}

	// Told a larger maximum than the queue's, the publisher sends it, and
	// SQS refuses that message alone.
	loose, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{QueueURL: func(string) string { return queue }, MaxMessageSize: 1 << 20})
	require.NoError(t, err)
	small := message("orders", "k1", []byte("fits"))
	res = loose.Publish(ctx, []broker.Message{big, small})
	require.Error(t, res[0].Err)
	require.NoError(t, res[1].Err)
	t.Logf("refused by SQS: %v", res[0].Err)

	db := oncekittest.NewDB(t)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	other := message("orders", "k2", []byte("fits too"))
	enqueue(t, db, ob, big, other)
	relay, err := outbox.NewRelay(db.Pool, ob, pub, relayConfig)
	require.NoError(t, err)
	stop := oncekittest.Start(t, relay.Run)
	until(t, "the large message to be parked", func() bool {
		parked, n, err := ob.Parked(ctx, db.Pool, 10)
		require.NoError(t, err)
		return n == 1 && parked[0].ID == big.ID
	})
	stop()
	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders", WaitTime: time.Second})
	require.NoError(t, err)
	defer src.Close()
	want := []uuid.UUID{small.ID, other.ID}
	for _, m := range msgs[1:] {
		want = append(want, m.ID)
	}
	receiveIDs(t, src, want...)
}

// SQS down when the relay starts: the failures count against the broker,
// not the messages (Connected reports false), so nothing is parked, and
// everything goes once SQS is up. A consumer started while SQS is down
// returns the error from Run.
func TestBrokerDownAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	name := "q-" + uuid.NewString()
	queue := endpoint + "/000000000000/" + name
	client := fauxqs.Client(endpoint)

	db := oncekittest.NewDB(t)
	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders", WaitTime: time.Second})
	require.NoError(t, err)
	defer src.Close()
	c, err := inbox.NewConsumer(db.Pool, src, inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Message) error { return nil }),
		&inbox.Config{Name: "billing", Schema: db.Schema})
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = c.Run(runCtx)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	t.Logf("consumer with SQS down: %v", err)

	calls := &counting{API: client}
	pub, err := sqsbroker.NewPublisher(calls, sqsbroker.PublisherConfig{QueueURL: func(string) string { return queue }})
	require.NoError(t, err)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	msgs := []broker.Message{message("orders", "k1", []byte("a")), message("orders", "k2", []byte("b")), message("orders", "k1", []byte("c"))}
	enqueue(t, db, ob, msgs...)
	relay, err := outbox.NewRelay(db.Pool, ob, pub, relayConfig)
	require.NoError(t, err)
	stop := oncekittest.Start(t, relay.Run)
	until(t, "the relay to try more rounds than MaxAttempts", func() bool { return calls.n.Load() > 3 })
	require.False(t, pub.Connected())
	_, n, err := ob.Parked(ctx, db.Pool, 10)
	require.NoError(t, err)
	require.Zero(t, n, "an outage parks nothing")

	fq := fauxqs.Start(t, port)
	_, err = fq.Client().CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	require.NoError(t, err)
	recv, err := sqsbroker.NewSource(fq.Client(), sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders", WaitTime: time.Second})
	require.NoError(t, err)
	defer recv.Close()
	receiveIDs(t, recv, msgs[0].ID, msgs[1].ID, msgs[2].ID)
	require.True(t, pub.Connected())
	stop()
	_, n, err = ob.Parked(ctx, db.Pool, 10)
	require.NoError(t, err)
	require.Zero(t, n)
	t.Logf("SendMessageBatch calls while down and after: %d", calls.n.Load())
}

// counting counts SendMessageBatch calls.
type counting struct {
	sqsbroker.API
	n atomic.Int64
}

func (c *counting) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	c.n.Add(1)
	return c.API.SendMessageBatch(ctx, in, opts...)
}

// deliveries counts the deliveries a source hands out.
type deliveries struct {
	broker.Source
	n atomic.Int64
}

func (d *deliveries) Receive(ctx context.Context, n int) ([]broker.Delivery, error) {
	ds, err := d.Source.Receive(ctx, n)
	d.n.Add(int64(len(ds)))
	return ds, err
}

// A handler running past the visibility timeout: the consumer keeps the
// message in progress (ChangeMessageVisibility), so SQS does not hand it
// out again mid-handler, and it is applied once and deleted.
func TestVisibilityExpiresMidHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := fauxqs.Shared(t).Client()
	queue := fauxqs.NewQueue(t, client, false, nil)
	db := oncekittest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE applied (event_id uuid NOT NULL)`)
	require.NoError(t, err)
	pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{QueueURL: func(string) string { return queue }})
	require.NoError(t, err)
	m := message("orders", "k1", []byte("slow"))
	require.NoError(t, pub.Publish(ctx, []broker.Message{m})[0].Err)

	const ackWait = time.Second
	inner, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders", AckWait: ackWait, WaitTime: time.Second})
	require.NoError(t, err)
	defer inner.Close()
	src := &deliveries{Source: inner}
	var runs atomic.Int64
	slow := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		runs.Add(1)
		select {
		case <-time.After(3 * ackWait): // work longer than the visibility timeout
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, msg.ID)
		return err
	})
	c, err := inbox.NewConsumer(db.Pool, src, slow, &inbox.Config{Name: "billing", Schema: db.Schema})
	require.NoError(t, err)
	stats := oncekittest.DrainConsumer(ctx, t, c, 1)
	require.EqualValues(t, 1, stats.Processed)
	var applied int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&applied))
	require.Equal(t, 1, applied)
	require.EqualValues(t, 1, runs.Load(), "the handler ran once")
	require.EqualValues(t, 1, src.n.Load(), "not handed out again while in progress")
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queue), AttributeNames: []types.QueueAttributeName{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"}})
	require.NoError(t, err)
	require.Equal(t, "0", out.Attributes["ApproximateNumberOfMessages"])
	require.Equal(t, "0", out.Attributes["ApproximateNumberOfMessagesNotVisible"], "deleted once applied")
}

// A queue whose redrive policy moves a message to its dead-letter queue
// after 5 receives: Limits reports MaxDeliver 5, and a consumer whose
// MaxAttempts (25 by default) would let SQS move a message before the
// inbox dead-letters it refuses to start. A source configured FIFO on a
// standard queue is refused too.
func TestRedrivePolicyBoundsMaxAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := fauxqs.Shared(t).Client()
	dlq := fauxqs.NewQueue(t, client, false, nil)
	attrs, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlq), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	policy := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":"5"}`, attrs.Attributes["QueueArn"])
	queue := fauxqs.NewQueue(t, client, false, map[string]string{"RedrivePolicy": policy})

	src, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders"})
	require.NoError(t, err)
	l, err := src.Limits(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, l.MaxDeliver)

	db := oncekittest.NewDB(t)
	c, err := inbox.NewConsumer(db.Pool, src, inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Message) error { return nil }),
		&inbox.Config{Name: "billing", Schema: db.Schema})
	require.NoError(t, err)
	err = c.Run(ctx)
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	t.Logf("MaxAttempts 25 on maxReceiveCount 5: %v", err)

	fifo, err := sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders", FIFO: true})
	require.NoError(t, err)
	_, err = fifo.Limits(ctx)
	require.ErrorIs(t, err, sqsbroker.ErrInvalidConfig)
	// Below it, a message its handler always refuses is dead-lettered by
	// the inbox at attempt 3 and deleted: SQS's dead-letter queue stays
	// empty, and nothing is delivered again.
	pub, err := sqsbroker.NewPublisher(client, sqsbroker.PublisherConfig{QueueURL: func(string) string { return queue }})
	require.NoError(t, err)
	require.NoError(t, pub.Publish(ctx, []broker.Message{message("orders", "k1", []byte("poison"))})[0].Err)
	src, err = sqsbroker.NewSource(client, sqsbroker.SourceConfig{QueueURL: queue, Subject: "orders", WaitTime: time.Second})
	require.NoError(t, err)
	defer src.Close()
	refuse := inbox.HandlerFunc(func(context.Context, pgx.Tx, *inbox.Message) error { return errors.New("poison") })
	c, err = inbox.NewConsumer(db.Pool, src, refuse, &inbox.Config{Name: "billing", Schema: db.Schema, MaxAttempts: 3, MinBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	stats := oncekittest.DrainConsumer(ctx, t, c, 1)
	require.EqualValues(t, 1, stats.DeadLettered)
	for _, q := range []string{queue, dlq} {
		out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q), AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
		require.NoError(t, err)
		for k, v := range out.Attributes {
			require.Equal(t, "0", v, "%s of %s", k, q)
		}
	}
}
