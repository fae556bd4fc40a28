package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/outbox"
)

// garbledErrors answers every failed publish with an error text that a text
// column refuses as it is, as a broker adapter relaying a binary reason may.
type garbledErrors struct{ broker.Publisher }

func (p garbledErrors) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	res := p.Publisher.Publish(ctx, msgs)
	for i := range res {
		if res[i].Err != nil {
			res[i].Err = errors.New("broker said \xff\xfe\x00")
		}
	}
	return res
}

// A broker error whose text is not UTF-8 and holds a NUL is stored made
// readable: the failed row counts its attempts and parks, and the others
// are published once. Before, PostgreSQL refused the settle statement and
// the batch was published again and again.
func TestRelayStoresUntrustedBrokerErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	bad := b.msg("k1", 1)
	bad.Subject = b.name + ".nostream" // JetStream rejects it
	others := []broker.Message{b.msg("k2", 1), b.msg("k2", 2), b.msg("", 0)}
	enqueue(t, b.db, b.ob, bad)
	enqueue(t, b.db, b.ob, others...)
	np, _ := publisher(t, b.nats.URL)
	b.startRelay(t, garbledErrors{np}, outbox.RelayConfig{
		MaxAttempts: 3, MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		PublishTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond,
	})
	var attempts int
	var lastErr string
	require.Eventually(t, func() bool {
		var parked bool
		err := b.db.Pool.QueryRow(ctx, `SELECT attempts, parked_at IS NOT NULL, coalesce(last_error, '') FROM outbox WHERE id = $1`, bad.ID).
			Scan(&attempts, &parked, &lastErr)
		return assert.NoError(t, err) && parked
	}, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 3, attempts)
	require.Equal(t, "broker said \uFFFD\uFFFD\uFFFD", lastErr)
	waitCount(t, b.stream, 3, 20*time.Second)
	requireExactlyOnceInOrder(t, readStream(t, b.stream), others)
}
