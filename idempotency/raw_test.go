package idempotency_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawPost sends POST /payments with hand-written extra header lines, for
// header values Go's client refuses to send.
func rawPost(t *testing.T, serverURL, headerLines string) (int, string) {
	t.Helper()
	u, err := url.Parse(serverURL)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()
	body := `{"amount":100}`
	_, err = io.WriteString(conn, "POST /payments HTTP/1.1\r\nHost: x\r\nX-Tenant: acme\r\nContent-Type: application/json\r\n"+
		headerLines+"Content-Length: 14\r\nConnection: close\r\n\r\n"+body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// newServer serves h on a loopback httptest server and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
