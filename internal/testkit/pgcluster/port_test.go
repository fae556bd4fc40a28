package pgcluster

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// A port bound by another process between its pick and the server's start
// (initdb runs in between) does not fail the cluster: it starts on another
// port. Not in parallel: it swaps the package's port picker.
func TestStartMovesOffAPortTakenMeanwhile(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	busy := taken.Addr().(*net.TCPAddr).Port
	picks := 0
	pickPort = func() (int, error) {
		picks++
		if picks == 1 {
			return busy, nil
		}
		return freePort()
	}
	defer func() { pickPort = freePort }()

	pg := StartForTest(context.Background(), t, Options{})
	require.NotEqual(t, busy, pg.port, "started on another port")
	require.Equal(t, 1, picks, "the first pick only: the retry picks with freePort")
	conn, err := net.Dial("tcp", pg.Addr())
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}
