package eventsig_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/eventsig"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

func newKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return pub, priv
}

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	pub1, priv1 := newKey(t)
	pub2, priv2 := newKey(t)
	s1, err := eventsig.NewSigner("k1", priv1)
	require.NoError(t, err)
	s2, err := eventsig.NewSigner("k2", priv2)
	require.NoError(t, err)
	v, err := eventsig.NewVerifier(map[string]ed25519.PublicKey{"k1": pub1, "k2": pub2})
	require.NoError(t, err)
	m := broker.Message{ID: uuid.New(), Subject: "orders.paid", Key: "order-1", Payload: []byte(`{"amount":100}`),
		Headers: map[string]string{"X-Tenant": "acme"}}
	for _, s := range []*eventsig.Signer{s1, s2} { // a rotation: both keys verify
		signed := s.Sign(m)
		require.NoError(t, v.Verify(&signed))
		require.Equal(t, "acme", signed.Headers["X-Tenant"])
		require.NotContains(t, m.Headers, eventsig.HeaderSignature, "Sign copies the headers")
	}
	signed := s1.Sign(m)
	for name, tamper := range map[string]func(*broker.Message){
		"payload":   func(m *broker.Message) { m.Payload = []byte(`{"amount":1}`) },
		"id":        func(m *broker.Message) { m.ID = uuid.New() },
		"subject":   func(m *broker.Message) { m.Subject = "orders.refunded" },
		"key":       func(m *broker.Message) { m.Key = "order-2" },
		"unsigned":  func(m *broker.Message) { delete(m.Headers, eventsig.HeaderSignature) },
		"key id":    func(m *broker.Message) { m.Headers[eventsig.HeaderKeyID] = "k9" },
		"signature": func(m *broker.Message) { m.Headers[eventsig.HeaderSignature] = "AAAA" },
	} {
		c := signed
		c.Headers = map[string]string{}
		for k, val := range signed.Headers {
			c.Headers[k] = val
		}
		tamper(&c)
		require.ErrorIs(t, v.Verify(&c), eventsig.ErrUnauthenticated, name)
	}
	_, err = eventsig.NewSigner("bad id", priv1)
	require.Error(t, err)
	_, err = eventsig.NewVerifier(nil)
	require.Error(t, err)
}

// A forged message published under a genuine event's ID before it (by
// anyone who can publish on the subject) and an unsigned one are
// dead-lettered as unauthenticated without a claim; the genuine, signed
// event is then applied once. Without a Verifier the forgery would be
// claimed and applied, and the genuine event dropped as its duplicate.
func TestForgedEventIsDeadLetteredAndTheGenuineApplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, nc := testenv.NewDB(t), testenv.NewNATS(t)
	stream := testenv.Name(t)
	_, err := natsjs.EnsureStream(ctx, nc.JS, natsjs.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `CREATE TABLE applied (id uuid, payload text)`)
	require.NoError(t, err)
	pubKey, privKey := newKey(t)
	signer, err := eventsig.NewSigner("relay-2026", privKey)
	require.NoError(t, err)
	verifier, err := eventsig.NewVerifier(map[string]ed25519.PublicKey{"relay-2026": pubKey})
	require.NoError(t, err)
	np, err := natsjs.NewPublisher(nc.Conn, nil)
	require.NoError(t, err)
	pub := eventsig.SignPublisher(np, signer)
	_, chained := pub.(broker.ChainPublisher)
	require.True(t, chained, "the signing publisher keeps natsjs's PublishChain")

	genuine := broker.Message{ID: uuid.New(), Subject: stream + ".paid", Key: "order-1", Payload: []byte("genuine")}
	publishRaw(t, nc.JS, genuine.Subject, map[string]string{broker.HeaderEventID: genuine.ID.String(),
		broker.HeaderKey: "order-1", eventsig.HeaderKeyID: "relay-2026", eventsig.HeaderSignature: "Zm9yZ2Vk"}, "forged")
	publishRaw(t, nc.JS, genuine.Subject, map[string]string{broker.HeaderEventID: uuid.NewString()}, "unsigned")
	res := pub.Publish(ctx, []broker.Message{genuine})
	require.NoError(t, res[0].Err)

	src, err := natsjs.NewSource(ctx, nc.JS, &natsjs.SourceConfig{Stream: stream, Durable: "c"})
	require.NoError(t, err)
	t.Cleanup(src.Close)
	h := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1, $2)`, msg.ID, string(msg.Payload))
		return err
	})
	c, err := inbox.NewConsumer(db.Pool, src, h, &inbox.Config{Name: "c", Schema: db.Schema, Verifier: verifier,
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	require.Eventually(t, func() bool { s := c.Stats(); return s.Processed == 1 && s.DeadLettered == 2 }, 30*time.Second, 10*time.Millisecond)

	var payload string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT payload FROM applied WHERE id = $1`, genuine.ID).Scan(&payload))
	require.Equal(t, "genuine", payload)
	rows, err := db.Pool.Query(ctx, `SELECT reason FROM dead_letters ORDER BY id`)
	require.NoError(t, err)
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, reasons, 2)
	for _, r := range reasons {
		require.Contains(t, r, "unauthenticated: eventsig: unauthenticated event")
	}
}

func publishRaw(t *testing.T, js jetstream.JetStream, subject string, headers map[string]string, payload string) {
	t.Helper()
	m := natsjs.NATSMsg(broker.Message{Subject: subject, Payload: []byte(payload)})
	m.Header = map[string][]string{}
	for k, v := range headers {
		m.Header.Set(k, v)
	}
	_, err := js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
}

// A message's signature headers come from anyone who can publish: a key ID
// or signature of hostile bytes (invalid UTF-8, NUL, terminal escapes,
// kilobytes) is refused as unauthenticated, with an error whose text quotes
// at most 64 characters of it.
func TestVerifyRefusesHostileHeaders(t *testing.T) {
	t.Parallel()
	pub, _ := newKey(t)
	v, err := eventsig.NewVerifier(map[string]ed25519.PublicKey{"k1": pub})
	require.NoError(t, err)
	long := strings.Repeat("\xff\x00\x1b[2J", 1000)
	for _, h := range []map[string]string{
		{eventsig.HeaderKeyID: long, eventsig.HeaderSignature: "AAAA"},
		{eventsig.HeaderKeyID: "k1", eventsig.HeaderSignature: long},
		{eventsig.HeaderKeyID: "k1\x00", eventsig.HeaderSignature: "\x1b]0;x\x07"},
	} {
		m := broker.Message{ID: uuid.New(), Subject: "s", Payload: []byte("p"), Headers: h}
		err := v.Verify(&m)
		require.ErrorIs(t, err, eventsig.ErrUnauthenticated)
		require.True(t, utf8.ValidString(err.Error()), "%q", err.Error())
		require.NotContains(t, err.Error(), "\x00")
		require.NotContains(t, err.Error(), "\x1b")
		require.Less(t, len(err.Error()), 400)
	}
}
