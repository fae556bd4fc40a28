package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/internal/wait"
)

// FuzzConsumeHostileMessages publishes a message with a random ID, header
// and payload to a real stream, next to a good neighbour, while a consumer
// runs on a real PostgreSQL. Its invariant: the hostile message is applied
// once, taken for a duplicate, dead-lettered or terminated, within bounded
// deliveries (the durable ends with nothing pending or unacknowledged), and
// the neighbour is applied once. The handler fails permanently on payloads
// that start with "perm", and with a non-UTF-8 error on those that hold
// 0xff, until MaxAttempts.
func FuzzConsumeHostileMessages(f *testing.F) {
	for _, seed := range []struct {
		id, name, value string
		payload         []byte
	}{
		{uuid.NewString(), "X-Tenant", "acme", []byte("ok")},
		{"id-\xff", "X-Bin", "\xff", []byte("bad id")},
		{strings.Repeat("x", 5000), "X-Long", "v", []byte("long id")},
		{uuid.NewString(), "X-Nul", "a\x00b", []byte("perm: nul header")},
		{uuid.NewString(), "X-Ctl", "\x1b[2J", []byte("fails \xff")},
		{"", "X-Empty", "", nil},
		{uuid.Nil.String(), "Nats-Expected-Stream", "nope", []byte("nil id")},
	} {
		f.Add(seed.id, seed.name, seed.value, seed.payload)
	}
	env := newFuzzConsumer(f)
	f.Fuzz(func(t *testing.T, id, name, value string, payload []byte) {
		env.check(t, id, name, value, payload)
	})
}

// fuzzConsumer is one stream, schema and running consumer, shared by the
// inputs of a fuzz process (one after the other).
type fuzzConsumer struct {
	b       *bundle
	c       *inbox.Consumer
	mu      sync.Mutex
	applied map[uuid.UUID]int
}

func newFuzzConsumer(f *testing.F) *fuzzConsumer {
	env := &fuzzConsumer{applied: map[uuid.UUID]int{}}
	b := &bundle{db: testenv.NewDB(f), nats: testenv.NewNATS(f)}
	b.stream = testenv.Name(f)
	b.subject = b.stream + ".events"
	ctx := context.Background()
	if _, err := natsjs.EnsureStream(ctx, b.nats.JS, natsjs.StreamConfig{Name: b.stream, Subjects: []string{b.stream + ".>"}}); err != nil {
		f.Fatal(err)
	}
	var err error
	if b.pub, err = natsjs.NewPublisher(b.nats.Conn, nil); err != nil {
		f.Fatal(err)
	}
	src, err := natsjs.NewSource(ctx, b.nats.JS, &natsjs.SourceConfig{Stream: b.stream, Durable: "fuzz", AckWait: 5 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(src.Close)
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		switch {
		case bytes.HasPrefix(msg.Payload, []byte("perm")):
			return inbox.Permanent(errors.New("refused: " + string(msg.Payload)))
		case bytes.IndexByte(msg.Payload, 0xff) >= 0:
			return errors.New("fails: " + string(msg.Payload))
		}
		env.mu.Lock()
		env.applied[msg.ID]++
		env.mu.Unlock()
		return nil
	})
	cfg := &inbox.Config{Name: "fuzz", Schema: b.db.Schema, BatchSize: 16, MaxAttempts: 3,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Registerer: prometheus.NewRegistry(), Logger: testLogger()}
	c, err := inbox.NewConsumer(b.db.Pool, src, h, cfg)
	if err != nil {
		f.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	f.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.Errorf("Run: %v", err)
		}
	})
	env.b, env.c = b, c
	return env
}

func (env *fuzzConsumer) check(t *testing.T, id, name, value string, payload []byte) {
	b := env.b
	before := env.c.Stats()
	m := nats.NewMsg(b.subject)
	m.Data = payload
	m.Header.Set(broker.HeaderMsgID, uuid.NewString()) // JetStream's dedup must not drop it
	m.Header.Set(broker.HeaderEventID, id)
	if name != "" {
		m.Header[name] = []string{value}
	}
	if _, err := b.nats.JS.PublishMsg(context.Background(), m); err != nil {
		t.Skipf("the broker refused the message: %v", err) // not the consumer's input
	}
	neighbour := broker.Message{ID: uuid.New(), Subject: b.subject, Payload: []byte("neighbour")}
	if res := b.pub.Publish(context.Background(), []broker.Message{neighbour}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := wait.Until(wctx, 5*time.Millisecond, func(context.Context) error {
		s := env.c.Stats()
		settled := (s.Processed + s.Duplicates + s.DeadLettered + s.Terminated) -
			(before.Processed + before.Duplicates + before.DeadLettered + before.Terminated)
		if settled >= 2 && env.drained(t) {
			return nil
		}
		return fmt.Errorf("stats %+v (before %+v)", s, before)
	}); err != nil {
		t.Fatalf("not settled within 30 s: %v; id %q, header %q=%q, payload %q", err, id, name, value, payload)
	}
	env.mu.Lock()
	defer env.mu.Unlock()
	if n := env.applied[neighbour.ID]; n != 1 {
		t.Fatalf("the neighbour was applied %d times", n)
	}
	for msgID, n := range env.applied {
		if n > 1 {
			t.Fatalf("message %s applied %d times", msgID, n)
		}
	}
}

// drained reports whether the durable has nothing left to deliver or
// awaiting an ack.
func (env *fuzzConsumer) drained(t *testing.T) bool {
	c, err := env.b.nats.JS.Consumer(context.Background(), env.b.stream, "fuzz")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	return err == nil && info.NumAckPending == 0 && info.NumPending == 0
}
