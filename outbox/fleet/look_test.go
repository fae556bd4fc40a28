package fleet_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox/fleet"
)

// While NATS is down every look's refresh fails (three a MemberTTL), and
// the log has one warning for the stretch, not one per look: the first
// failure with its error, then, once NATS is back, one line saying how
// long it lasted. (The list stays readable meanwhile: it is the watch's,
// as of the member's last refresh.)
func TestLookFailuresAreLoggedOncePerStretch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := testenv.StartServer(t, dir, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	// No reconnect buffer: a refresh fails at once while NATS is down
	// rather than waiting out the request's timeout.
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	var logs testenv.SyncBuffer
	f, err := fleet.New(js, nopPublisher{}, &fleet.Config{
		ID: "m1", Bucket: testenv.Name(t), MemberTTL: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool { return len(f.Members()) == 1 }, 10*time.Second, 10*time.Millisecond)

	count := func(msg string) int { return strings.Count(logs.String(), msg) }
	const refreshFailed = "refreshing the fleet entry failed"
	srv.Shutdown()
	srv.WaitForShutdown()
	require.Eventually(t, func() bool { return count(refreshFailed) > 0 }, 10*time.Second, 10*time.Millisecond, "%s", logs.String())
	// Six more looks, each failing.
	require.Never(t, func() bool { return count(refreshFailed) > 1 }, 2*time.Second, 20*time.Millisecond,
		"a failure logged again within its stretch")

	testenv.StartServer(t, dir, port)
	require.Eventually(t, func() bool { return count("refreshing the fleet entry works again") == 1 }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, count(refreshFailed))
	require.Regexp(t, `works again" .*failed_looks=([6-9]|\d\d+) for=`, logs.String(), "the recovery says how many looks failed")
}
