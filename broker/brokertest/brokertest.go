package brokertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
)

// Features says what a broker offers; the suite checks each one it claims,
// and checks the stated alternative of each one it does not.
type Features struct {
	// DedupByID: publishing a message whose ID the broker stored recently is
	// acknowledged with Result.Duplicate and not delivered again (JetStream
	// within its Duplicates window). When false, and DedupSilently is too,
	// the suite checks that both copies are delivered with the same event
	// ID header instead.
	DedupByID bool
	// DedupSilently: the broker drops a copy whose ID it stored recently but
	// acknowledges it as it does any message (an SQS FIFO queue within its
	// 5-minute MessageDeduplicationId window): Result.Duplicate stays
	// false, the copy is not delivered, and the source reports the window
	// in SourceLimits.Duplicates. It excludes DedupByID.
	DedupSilently bool
	// OrderedByKey: messages of one key, each published after the previous
	// one was acknowledged, reach a single source in that order. (What
	// happens after a nak is the inbox's business: its ordered mode retries
	// in place instead of nakking.)
	OrderedByKey bool
	// AttemptsAcrossConsumers: Delivery.Attempt counts the deliveries to
	// every consumer of the group (kept by the broker), so a message
	// redelivered after a consumer went away reports 2. When false, attempts
	// are counted per source, from 1.
	AttemptsAcrossConsumers bool
	// Redelivery is how long the broker may take to redeliver what a closed
	// consumer held and never acked (its ack wait, or its claim delay).
	// Defaults to 10 s.
	Redelivery time.Duration
}

// Env is one isolated destination on the broker under test.
type Env struct {
	// Publisher publishes to the destination.
	Publisher broker.Publisher
	// Subject is what messages are published to for Open's sources to
	// receive them.
	Subject string
	// Refused, if not empty, is a subject the broker refuses messages for
	// (no stream captures it, the queue rejects publishes, the key has the
	// wrong type). The batch test then checks a per-message failure.
	Refused string
	// Open returns a new source on the destination: one more consumer of
	// the same group, as a second process of the same service would open.
	// close stops it without settling anything (the suite settles first
	// when it means to); it must be safe to call twice.
	Open func(t *testing.T) (src broker.Source, close func())
}

// Harness connects the suite to an adapter.
type Harness struct {
	Features Features
	// New creates an isolated destination for one test; it registers its
	// own cleanup on t.
	New func(t *testing.T) Env
}

// Run runs the suite as subtests of t, in parallel.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Features.DedupByID && h.Features.DedupSilently {
		t.Fatal("brokertest: Features.DedupByID and DedupSilently exclude each other")
	}
	if h.Features.Redelivery <= 0 {
		h.Features.Redelivery = 10 * time.Second
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"PublishAck", testPublishAck},
		{"BatchResults", testBatchResults},
		{"DedupByID", testDedup},
		{"Headers", testHeaders},
		{"RedeliveryAfterCrash", testRedeliveryAfterCrash},
		{"NakWithDelay", testNakWithDelay},
		{"KeyOrder", testKeyOrder},
		{"Close", testClose},
		{"Limits", testLimits},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

// timeout bounds every wait of the suite.
const timeout = 30 * time.Second

// openEnv starts a test on a fresh destination with a source open on it,
// closed when the test ends.
func openEnv(t *testing.T, h Harness) (Env, broker.Source) {
	env := h.New(t)
	src, closeSrc := env.Open(t)
	t.Cleanup(closeSrc)
	return env, src
}

func newMsg(env Env, i int) broker.Message {
	return broker.Message{ID: uuid.New(), Subject: env.Subject, Payload: []byte(fmt.Sprintf("m%d", i))}
}

func publish(t *testing.T, env Env, msgs ...broker.Message) []broker.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res := env.Publisher.Publish(ctx, msgs)
	require.Len(t, res, len(msgs), "one result per message")
	for i, r := range res {
		require.Equal(t, msgs[i].ID, r.ID, "results in input order")
	}
	return res
}

func publishOK(t *testing.T, env Env, msgs ...broker.Message) {
	t.Helper()
	for _, r := range publish(t, env, msgs...) {
		require.NoError(t, r.Err)
	}
}

// receive returns the next n deliveries of src without settling them,
// failing after timeout. Some sources hand out a message only once the
// previous ones are settled (a watermill subscription does): use drain for
// more than one message.
func receive(t *testing.T, src broker.Source, n int) []broker.Delivery {
	t.Helper()
	return take(t, src, n, false)
}

// drain receives n deliveries of src and acks each once seen; it returns
// them in the order received.
func drain(t *testing.T, src broker.Source, n int) []broker.Delivery {
	t.Helper()
	return take(t, src, n, true)
}

func take(t *testing.T, src broker.Source, n int, settle bool) []broker.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []broker.Delivery
	for len(out) < n {
		ds, err := src.Receive(ctx, n-len(out))
		require.NoError(t, err, "received %d of %d", len(out), n)
		require.NotEmpty(t, ds, "Receive returns at least one message")
		require.LessOrEqual(t, len(ds), n-len(out), "Receive returns at most max messages")
		if settle {
			ack(t, ds...)
		}
		out = append(out, ds...)
	}
	return out
}

// nothingWithin checks that src delivers nothing within d.
func nothingWithin(t *testing.T, src broker.Source, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := src.Receive(ctx, 10)
	require.ErrorIs(t, err, context.DeadlineExceeded, "nothing more is delivered")
	require.Empty(t, ds)
}

func ack(t *testing.T, ds ...broker.Delivery) {
	t.Helper()
	for _, d := range ds {
		require.NoError(t, d.Ack(context.Background()))
	}
}

func eventID(d broker.Delivery) string { return d.Header(broker.HeaderEventID) }

func testPublishAck(t *testing.T, h Harness) {
	env, src := openEnv(t, h)
	msgs := make([]broker.Message, 5)
	want := map[string]string{}
	for i := range msgs {
		msgs[i] = newMsg(env, i)
		want[msgs[i].ID.String()] = string(msgs[i].Payload)
	}
	publishOK(t, env, msgs...)
	got := map[string]string{}
	for _, d := range drain(t, src, len(msgs)) {
		require.Equal(t, env.Subject, d.Subject())
		require.Equal(t, 1, d.Attempt(), "first delivery")
		got[eventID(d)] = string(d.Data())
	}
	require.Equal(t, want, got, "every message once, with its event ID and payload")
	nothingWithin(t, src, min(h.Features.Redelivery+time.Second, 5*time.Second))
}

func testBatchResults(t *testing.T, h Harness) {
	env := h.New(t)
	msgs := []broker.Message{newMsg(env, 0), newMsg(env, 1), newMsg(env, 2)}
	if env.Refused != "" {
		msgs[1].Subject = env.Refused
	}
	res := publish(t, env, msgs...)
	require.NoError(t, res[0].Err)
	require.NoError(t, res[2].Err)
	if env.Refused != "" {
		require.Error(t, res[1].Err, "the refused message fails on its own")
	} else {
		require.NoError(t, res[1].Err)
	}
	src, closeSrc := env.Open(t)
	defer closeSrc()
	n := 3
	if env.Refused != "" {
		n = 2
	}
	got := map[string]bool{}
	for _, d := range drain(t, src, n) {
		got[eventID(d)] = true
	}
	require.True(t, got[msgs[0].ID.String()] && got[msgs[2].ID.String()], "the accepted messages are delivered")
}

func testDedup(t *testing.T, h Harness) {
	env, src := openEnv(t, h)
	m := newMsg(env, 0)
	publishOK(t, env, m)
	res := publish(t, env, m)
	require.NoError(t, res[0].Err)
	if h.Features.DedupSilently {
		// Dropped without a word: the inbox learns nothing from the
		// result, and only one copy arrives.
		require.False(t, res[0].Duplicate, "a silent dedup reports no duplicate")
		ds := receive(t, src, 1)
		require.Equal(t, m.ID.String(), eventID(ds[0]))
		ack(t, ds...)
		nothingWithin(t, src, 2*time.Second)
		return
	}
	if !h.Features.DedupByID {
		// Not offered: both copies arrive, and the event ID they carry is
		// what the inbox's claim dedups on.
		require.False(t, res[0].Duplicate, "a broker without dedup reports no duplicate")
		ds := drain(t, src, 2)
		require.Equal(t, m.ID.String(), eventID(ds[0]))
		require.Equal(t, m.ID.String(), eventID(ds[1]))
		return
	}
	require.True(t, res[0].Duplicate, "the second copy is recognised")
	ds := receive(t, src, 1)
	require.Equal(t, m.ID.String(), eventID(ds[0]))
	ack(t, ds...)
	nothingWithin(t, src, 2*time.Second)
}

func testHeaders(t *testing.T, h Harness) {
	env, src := openEnv(t, h)
	m := newMsg(env, 0)
	m.Key = "order-42"
	m.Headers = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "congo=t61rcWkgMzE",
		"X-Tenant":    "acme",
	}
	publishOK(t, env, m)
	d := receive(t, src, 1)[0]
	ack(t, d)
	require.Equal(t, m.ID.String(), eventID(d))
	require.Equal(t, "order-42", d.Header(broker.HeaderKey))
	for k, v := range m.Headers {
		require.Equal(t, v, d.Header(k), "header %s", k)
		require.Equal(t, []string{v}, d.Headers()[k], "header %s in Headers", k)
	}
	require.Equal(t, []string{m.ID.String()}, d.Headers()[broker.HeaderEventID])
}

// testRedeliveryAfterCrash: a consumer receives messages and goes away
// without acking; another consumer of the group gets them.
func testRedeliveryAfterCrash(t *testing.T, h Harness) {
	env := h.New(t)
	first, closeFirst := env.Open(t)
	msgs := []broker.Message{newMsg(env, 0), newMsg(env, 1)}
	publishOK(t, env, msgs...)
	held := receive(t, first, 1)
	closeFirst()

	second, closeSecond := env.Open(t)
	defer closeSecond()
	start := time.Now()
	got := map[string]int{}
	for _, d := range drain(t, second, 2) {
		got[eventID(d)] = d.Attempt()
	}
	require.Less(t, time.Since(start), h.Features.Redelivery+timeout/2)
	want := 1
	if h.Features.AttemptsAcrossConsumers {
		want = 2
	}
	require.Equal(t, want, got[eventID(held[0])], "the held message's attempt")
	require.Len(t, got, 2, "both messages, the held one included")
}

func testNakWithDelay(t *testing.T, h Harness) {
	env, src := openEnv(t, h)
	m := newMsg(env, 0)
	publishOK(t, env, m)
	d := receive(t, src, 1)[0]
	const delay = 1500 * time.Millisecond
	nakAt := time.Now()
	require.NoError(t, d.Nak(context.Background(), delay))
	again := receive(t, src, 1)[0]
	require.GreaterOrEqual(t, time.Since(nakAt), delay, "not redelivered before the delay")
	require.Equal(t, m.ID.String(), eventID(again))
	require.Equal(t, 2, again.Attempt())
	ack(t, again)
}

func testKeyOrder(t *testing.T, h Harness) {
	if !h.Features.OrderedByKey {
		t.Skip("the broker does not promise per-key order")
	}
	env, src := openEnv(t, h)
	const n = 20
	var want []string
	for i := range n {
		m := newMsg(env, i)
		m.Key = "k" + fmt.Sprint(i%2)
		want = append(want, m.ID.String())
		publishOK(t, env, m) // one at a time, as the relay sends a key's messages
	}
	var got []string
	for _, d := range drain(t, src, n) {
		got = append(got, eventID(d))
	}
	require.Equal(t, want, got, "publish order")
}

func testClose(t *testing.T, h Harness) {
	env := h.New(t)
	src, closeSrc := env.Open(t)
	// A Receive blocked when the source closes returns ErrSourceClosed.
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(context.Background(), 1)
		errc <- err
	}()
	// A Receive whose ctx ends returns the ctx error.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := src.Receive(ctx, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	closeSrc()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, broker.ErrSourceClosed)
	case <-time.After(timeout):
		t.Fatal("Receive still blocked after Close")
	}
	_, err = src.Receive(context.Background(), 1)
	require.ErrorIs(t, err, broker.ErrSourceClosed)
	require.True(t, errors.Is(err, broker.ErrSourceClosed))
	closeSrc() // twice is harmless
}

func testLimits(t *testing.T, h Harness) {
	_, src := openEnv(t, h)
	l, err := src.Limits(context.Background())
	require.NoError(t, err)
	require.Positive(t, l.AckWait, "an ack wait, for the inbox's retention check")
	if h.Features.DedupByID || h.Features.DedupSilently {
		require.Positive(t, l.Duplicates, "the dedup window")
	} else {
		require.Zero(t, l.Duplicates, "no dedup window")
	}
}
