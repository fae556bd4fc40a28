package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/crashpoint"
	"github.com/oncekit/oncekit/internal/testkit/brokerkill"
)

// A consumer process SIGKILLed with a message in hand (handled, not
// committed) leaves it to the group: another member gets it once the
// group's session timeout has evicted the dead one. The test measures that
// redelivery time.
func TestRedeliveryAfterConsumerKill(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	brokers, topic, db := w.brokers, w.topic, w.db
	ctx := context.Background()
	// The table the helper's handler writes.
	_, err := db.Pool.Exec(ctx, `CREATE TABLE `+brokerkill.Effects+
		` (id bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL, seq int NOT NULL)`)
	require.NoError(t, err)
	m := w.msg("k", []byte("0"))
	w.enqueue(t, m)
	w.startRelay(t)

	// A consumer process that dies holding the message.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), brokersEnv+"="+strings.Join(brokers, ","), topicEnv+"="+topic,
		brokerkill.EnvRole+"=consumer", brokerkill.EnvDB+"="+db.URL, brokerkill.EnvSchema+"="+db.Schema,
		crashpoint.EnvVar+"="+crashpoint.InboxBeforeCommit)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v\n%s", err, out)
	ws, _ := ee.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "killed at its crash point: %v\n%s", err, out)
	killed := time.Now()

	// Another member of the group gets it.
	src, closeSrc, err := kafkaBroker(brokers, topic).NewSource(ctx)
	require.NoError(t, err)
	t.Cleanup(closeSrc)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	d, err := src.Receive(rctx, 1)
	require.NoError(t, err)
	redelivered := time.Since(killed)
	require.Equal(t, m.ID.String(), d[0].Header(broker.HeaderEventID))
	require.NoError(t, d[0].Ack(ctx))
	t.Logf("redelivered %s after the SIGKILL (group session timeout %s)", redelivered.Round(time.Millisecond), testSession)
	require.GreaterOrEqual(t, redelivered, testSession/2, "not before the session timeout")
}
