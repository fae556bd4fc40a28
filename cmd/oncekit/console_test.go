package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
)

// lockedBuffer is a Buffer safe for the command's goroutine and the test's.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startConsole runs `oncekit console args...` until the test ends and
// returns the address it serves on.
func startConsole(t *testing.T, db *testenv.DB, vars map[string]string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out lockedBuffer
	e := &env{stdout: &out, stderr: &out, getenv: func(k string) string {
		switch k {
		case "DATABASE_URL":
			return db.URL
		case "ONCEKIT_SCHEMA":
			return db.Schema
		}
		return vars[k]
	}}
	done := make(chan int, 1)
	go func() { done <- run(ctx, e, append([]string{"console"}, args...)) }()
	t.Cleanup(func() {
		cancel()
		require.Equal(t, 0, <-done, out.String())
	})
	served := regexp.MustCompile(`console on http://([^/]+)/`)
	var addr string
	require.Eventually(t, func() bool {
		if m := served.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, 10*time.Second, 10*time.Millisecond, "the console did not start")
	return addr
}

// By default the console listens on loopback only, and is read-only.
func TestConsoleListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	addr := startConsole(t, db, nil)
	require.Equal(t, defaultConsoleListen, addr)
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, port, _ := net.SplitHostPort(addr)
	for _, ip := range nonLoopbackIPs(t) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), time.Second)
		if err == nil {
			_ = conn.Close()
		}
		require.Error(t, err, "reachable on %s", ip)
	}
	resp, err = http.Post("http://"+addr+"/outbox/unpark", "application/x-www-form-urlencoded", nil)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only")
}

// Writes need operators; their passwords never appear in an error.
func TestConsoleWritesNeedOperators(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	code, _, stderr := runEffectsCLI(t, db, "console", "--writes", "--listen", "127.0.0.1:0")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "Operators or TrustedHeader")
	e := &env{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}, getenv: func(k string) string {
		if k == "ONCEKIT_CONSOLE_OPERATORS" {
			return "ana:hunter2-but-longer,bo"
		}
		return map[string]string{"DATABASE_URL": db.URL, "ONCEKIT_SCHEMA": db.Schema}[k]
	}}
	require.Equal(t, 2, run(context.Background(), e, []string{"console", "--writes", "--listen", "127.0.0.1:0"}))
	require.Contains(t, e.stderr.(*bytes.Buffer).String(), "entry 2 is not name:password")
	require.NotContains(t, e.stderr.(*bytes.Buffer).String(), "hunter2")
}

// nonLoopbackIPs are this machine's addresses other than loopback.
func nonLoopbackIPs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	var out []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			out = append(out, n.IP.String())
		}
	}
	return out
}

// --fleet serves a Fleet page of the list's databases, read again at each
// view; a list that cannot be read is refused at start, and
// --fleet-timeout without --fleet is refused.
func TestConsoleFleetPage(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	file := writeFleetFile(t, [3]string{"orders", db.URL, db.Schema})
	addr := startConsole(t, db, nil, "--listen", "127.0.0.1:0", "--fleet", file, "--fleet-timeout", "2s")
	page := func() string {
		resp, err := http.Get("http://" + addr + "/fleet")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	require.Contains(t, page(), "<td>orders</td><td>up</td>")
	require.NoError(t, os.WriteFile(file, []byte(`[{"name":"orders","url":"`+db.URL+`","schema":"`+db.Schema+
		`"},{"name":"billing","url":"postgres://relay:S3cret@`+testenv.FreeAddr(t)+`/x"}]`), 0o600))
	p := page()
	require.Contains(t, p, `<td>billing</td><td class="bad">down: unreachable`)
	require.NotContains(t, p, "S3cret")

	code, _, stderr := runEffectsCLI(t, db, "console", "--listen", "127.0.0.1:0", "--fleet", filepath.Join(t.TempDir(), "missing.json"))
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--fleet:")
	code, _, stderr = runEffectsCLI(t, db, "console", "--listen", "127.0.0.1:0", "--fleet-timeout", "1s")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--fleet-timeout needs --fleet")
}
