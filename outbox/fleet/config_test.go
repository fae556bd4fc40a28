package fleet_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
)

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	for _, c := range []struct {
		name string
		cfg  fleet.Config
	}{
		{"ID", fleet.Config{ID: "member\x00"}},
		{"Group", fleet.Config{Group: "rack\xff"}},
		{"Replicas", fleet.Config{Replicas: -1}},
		{"MemberTTL", fleet.Config{MemberTTL: time.Millisecond}},
		{"MaxConnsPerDatabase", fleet.Config{MaxConnsPerDatabase: 1}},
		{"Bucket", fleet.Config{Bucket: "a.b"}},
		{"BucketReplicas", fleet.Config{BucketReplicas: 6}},
		{"MaxBackoff", fleet.Config{MinBackoff: time.Minute, MaxBackoff: time.Second}},
	} {
		_, err := fleet.New(n.JS, nopPublisher{}, &c.cfg)
		require.ErrorIs(t, err, fleet.ErrInvalidConfig, c.name)
		require.ErrorContains(t, err, "Config."+c.name)
	}
	_, err := fleet.New(n.JS, nopPublisher{}, &fleet.Config{Relay: outbox.RelayConfig{Lease: time.Millisecond}})
	require.ErrorIs(t, err, fleet.ErrInvalidConfig)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	require.ErrorContains(t, err, "RelayConfig.Lease: 1ms is below 300ms")
	_, err = fleet.New(nil, nopPublisher{}, nil)
	require.ErrorIs(t, err, fleet.ErrInvalidConfig)
	_, err = fleet.New(n.JS, nil, nil)
	require.ErrorIs(t, err, fleet.ErrInvalidConfig)
}

// A bad list is refused whole, naming the entry and never a URL.
func TestSetRefusesBadLists(t *testing.T) {
	t.Parallel()
	n := testenv.NewNATS(t)
	f, err := fleet.New(n.JS, nopPublisher{}, nil)
	require.NoError(t, err)
	const secret = "postgres://app:s3cret@db.internal/app"
	for name, dbs := range map[string][]fleet.Database{
		"listed twice":    {{Name: "a", URL: secret}, {Name: "a", URL: secret + "2"}},
		"are one outbox":  {{Name: "a", URL: secret}, {Name: "b", URL: secret}},
		"url is empty":    {{Name: "a"}},
		"letters, digits": {{Name: "a b", URL: secret}},
		`database "a"`:    {{Name: "a", URL: secret, Schema: "bad schema"}},
		"1 to 63 bytes":   {{Name: "", URL: secret}},
	} {
		err := f.Set(dbs)
		require.ErrorIs(t, err, fleet.ErrInvalidConfig, name)
		require.ErrorContains(t, err, name)
		require.NotContains(t, err.Error(), "s3cret")
	}
	require.NoError(t, f.Set([]fleet.Database{{Name: "a", URL: secret}, {Name: "b", URL: secret, Schema: "other"}}))
}

func TestReadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`[{"name":"orders","url":"postgres://h/orders"},{"name":"billing","url":"postgres://h/billing","schema":"ok"}]`), 0o600))
	dbs, err := fleet.ReadFile(good)
	require.NoError(t, err)
	require.Equal(t, []fleet.Database{{Name: "orders", URL: "postgres://h/orders"}, {Name: "billing", URL: "postgres://h/billing", Schema: "ok"}}, dbs)

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`[{"name":"orders","url":"postgres://u:s3cret@h/orders"},{"name":"orders","url":"postgres://u:s3cret@h/x"}]`), 0o600))
	_, err = fleet.ReadFile(bad)
	require.ErrorIs(t, err, fleet.ErrInvalidConfig)
	require.ErrorContains(t, err, bad)
	require.NotContains(t, err.Error(), "s3cret")

	require.NoError(t, os.WriteFile(bad, []byte(`{"name":`), 0o600))
	_, err = fleet.ReadFile(bad)
	require.ErrorIs(t, err, fleet.ErrInvalidConfig)
	_, err = fleet.ReadFile(filepath.Join(dir, "missing.json"))
	require.Error(t, err)
}
