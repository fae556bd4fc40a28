package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The ops listener closes a keep-alive connection left idle, and one whose
// client never finishes its request: neither holds a connection for ever.
func TestOpsServerClosesIdleConnections(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") }))
	srv.Config = opsServer(srv.Config.Handler, 200*time.Millisecond)
	srv.Start()
	t.Cleanup(srv.Close)
	require.Equal(t, opsReadTimeout, srv.Config.ReadTimeout)
	require.Equal(t, opsWriteTimeout, srv.Config.WriteTimeout)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	// Idle now: the server closes the connection after its idle timeout.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	start := time.Now()
	_, err = conn.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the idle connection was closed by the server")
	require.Less(t, time.Since(start), 5*time.Second)
}
