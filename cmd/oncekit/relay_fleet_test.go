package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/broker"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// `oncekit relay --fleet FILE` serves the databases its file lists, and
// follows the file: a database removed there stops being served.
func TestRelayFleetServesTheFileDatabases(t *testing.T) {
	t.Parallel()
	a, b := testenv.NewDB(t), testenv.NewDB(t)
	n := testenv.NewNATS(t)
	stream := testenv.Name(t)
	addr := testenv.FreeAddr(t)
	file := filepath.Join(t.TempDir(), "fleet.json")
	write := func(dbs ...*testenv.DB) {
		var list []map[string]string
		for i, d := range dbs {
			list = append(list, map[string]string{"name": []string{"a", "b"}[i], "url": d.URL, "schema": d.Schema})
		}
		raw, err := json.Marshal(list)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(file+".tmp", raw, 0o600))
		require.NoError(t, os.Rename(file+".tmp", file))
	}
	write(a, b)
	var stderr testenv.SyncBuffer
	e := &env{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string {
		return map[string]string{"NATS_URL": n.URL}[k]
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, e, []string{"relay", "--fleet", file, "--fleet-bucket", stream, "--fleet-member-ttl", "1500ms",
			"--fleet-reload", "100ms", "--listen", addr, "--stream", stream, "--subjects", stream + ".>",
			"--poll-interval", "100ms", "--lease", "2s"})
	}()
	t.Cleanup(func() {
		cancel()
		require.Equal(t, 0, <-done, stderr.String())
	})
	for _, d := range []*testenv.DB{a, b} {
		ob, err := outbox.New(&outbox.Config{Schema: d.Schema})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(context.Background(), d.Pool, func(tx pgx.Tx) error {
			_, err := ob.Enqueue(context.Background(), tx, broker.Message{ID: uuid.New(), Subject: stream + ".x", Key: "k", Payload: []byte("p")})
			return err
		}))
	}
	s, err := n.JS.Stream(context.Background(), stream)
	require.Eventually(t, func() bool {
		if err != nil {
			s, err = n.JS.Stream(context.Background(), stream)
			return false
		}
		info, ierr := s.Info(context.Background())
		return ierr == nil && info.State.Msgs == 2
	}, 30*time.Second, 20*time.Millisecond, stderr.String())
	metrics := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close() //nolint:errcheck
		raw, _ := io.ReadAll(resp.Body)
		return string(raw)
	}
	require.Contains(t, metrics(), "\noncekit_fleet_databases_owned 2\n")
	write(a)
	require.Eventually(t, func() bool { return strings.Contains(metrics(), "\noncekit_fleet_databases_owned 1\n") },
		30*time.Second, 20*time.Millisecond, stderr.String())
	require.NotContains(t, stderr.String(), a.URL, "no URL in the logs")
}

func TestRelayFleetFlags(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	file, bad := filepath.Join(t.TempDir(), "fleet.json"), filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(file, []byte(`[{"name":"a","url":"postgres://u:s3cret@h/a"}]`), 0o600))
	require.NoError(t, os.WriteFile(bad, []byte(`[{"name":"a","url":"postgres://u:s3cret@h/a"},{"name":"a","url":"postgres://u:s3cret@h/b"}]`), 0o600))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"relay", "--fleet-replicas", "2"}, "--fleet-replicas needs --fleet"},
		{[]string{"relay", "--fleet", "f.json", "--logical"}, "--logical does not apply"},
		{[]string{"relay", "--fleet", "f.json", "--fleet-reload", "0s"}, "--fleet-reload: 0s is not positive"},
		{[]string{"relay", "--fleet", file, "--lease", "1ms"}, "--lease: 1ms is below 300ms"},
		{[]string{"relay", "--fleet", file, "--fleet-member-ttl", "10ms"}, "--fleet-member-ttl: 10ms is below 1s"},
		{[]string{"relay", "--fleet", file, "--fleet-max-conns", "1"}, "--fleet-max-conns: 1 is below 2"},
		{[]string{"relay", "--fleet", file, "--fleet-bucket-replicas", "6"}, "--fleet-bucket-replicas: 6 is not 1 to 5"},
		{[]string{"relay", "--fleet-bucket-replicas", "3"}, "--fleet-bucket-replicas needs --fleet"},
		{[]string{"relay", "--fleet-group", "rack-1"}, "--fleet-group needs --fleet"},
		{[]string{"relay", "--fleet", file, "--fleet-group", "rack\x001"}, "--fleet-group"},
		{[]string{"relay", "--fleet", bad}, `database "a" listed twice`},
	} {
		var stderr testenv.SyncBuffer
		e := &env{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string {
			return map[string]string{"NATS_URL": n.URL}[k]
		}}
		require.Equal(t, 2, run(context.Background(), e, c.args), "%v", c.args)
		require.Contains(t, stderr.String(), c.want)
		require.NotContains(t, stderr.String(), "s3cret")
	}
}
