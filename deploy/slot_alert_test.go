package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/deploy"
	"github.com/oncekit/oncekit/internal/testkit/pgcluster"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
)

// rulesWithShortFor writes alerts.yml with the `for` of alert shortened to
// forDur, so that a test need not wait out production's delay; every
// expression stays as shipped.
func rulesWithShortFor(t *testing.T, alert, forDur string) string {
	t.Helper()
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(deploy.Alerts, &doc))
	found := false
	for _, g := range doc["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			if rule := r.(map[string]any); rule["alert"] == alert {
				rule["for"], found = forDur, true
			}
		}
	}
	require.True(t, found, "no alert %s in alerts.yml", alert)
	out, err := yaml.Marshal(doc)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "alerts.yml")
	require.NoError(t, os.WriteFile(path, out, 0o600))
	return path
}

// promAlert is an alert as Prometheus's /api/v1/alerts reports it.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	Value       string            `json:"value"`
}

func promAlerts(base string) ([]promAlert, bool) {
	resp, err := http.Get(base + "/api/v1/alerts")
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil || r.Status != "success" {
		return nil, false
	}
	return r.Data.Alerts, true
}

// A real Prometheus scrapes a logical relay that stands by behind a lease
// no relay streams under, its slot inactive: once the slot keeps more than
// 100 MB of WAL, OncekitOutboxSlotInactive fires, with the figure in its
// summary (its `for` shortened from 5 minutes to 1 second).
func TestPrometheusFiresTheInactiveSlotAlert(t *testing.T) {
	t.Parallel()
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (Debian: apt-get install prometheus); .ci/run installs it")
	}
	ctx := context.Background()
	pg := pgcluster.StartForTest(ctx, t, pgcluster.Options{Settings: "wal_level = logical\nfsync = off\n"})
	db := testenv.NewDBOn(t, pg.URL("postgres"))
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	require.NoError(t, ob.SetUpLogical(ctx, db.Pool))

	// The lease held by a session that never streams: a stuck leader.
	lease, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Conn().Close(context.Background()); lease.Release() })
	_, err = lease.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('oncekit.logical_relay.' || $1, 0))`, "oncekit_"+db.Schema)
	require.NoError(t, err)

	nc := testenv.NewNATS(t)
	pub, err := natsjs.NewPublisher(nc.Conn, nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	relay, err := outbox.NewLogicalRelay(db.Pool, ob, pub, &outbox.LogicalRelayConfig{
		Registerer: reg, StatusInterval: 400 * time.Millisecond})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)

	dir, promAddr := t.TempDir(), testenv.FreeAddr(t)
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: relay
    static_configs: [{targets: [%q]}]
`, rulesWithShortFor(t, "OncekitOutboxSlotInactive", "1s"), metrics.Listener.Addr().String())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600))
	start(t, "prometheus", nil, promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	base := "http://" + promAddr

	slotAlert := func() (promAlert, bool) {
		alerts, _ := promAlerts(base)
		for _, a := range alerts {
			if a.Labels["alertname"] == "OncekitOutboxSlotInactive" {
				return a, true
			}
		}
		return promAlert{}, false
	}
	// Inactive, but holding little: no alert.
	require.Eventually(t, func() bool {
		r, ok := promGet(t, base, `/api/v1/query?query=oncekit_outbox_logical_slot_active%7Bjob%3D%22relay%22%7D+%3D%3D+0`)
		return ok && len(r.Data.Result) > 0
	}, 60*time.Second, 250*time.Millisecond, "the relay's slot gauges reach Prometheus")
	seen := time.Now()
	require.Eventually(t, func() bool { return evaluatedSince(base, "OncekitOutboxSlotInactive", seen) }, 30*time.Second,
		100*time.Millisecond, "the rule is evaluated on the gauges")
	_, pending := slotAlert()
	require.False(t, pending, "a slot keeping little WAL raises nothing")

	// Eight WAL segments past the slot's restart position.
	for range 8 {
		_, err := db.Pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'filler', 'x'); SELECT pg_switch_wal()`)
		require.NoError(t, err)
	}
	s, err := ob.SlotStatus(ctx, db.Pool)
	require.NoError(t, err)
	require.Greater(t, s.RetainedBytes, int64(1e8))
	require.False(t, s.Active)

	var fired promAlert
	require.Eventually(t, func() bool {
		a, ok := slotAlert()
		fired = a
		return ok && a.State == "firing"
	}, 60*time.Second, 250*time.Millisecond, "OncekitOutboxSlotInactive fires")
	t.Logf("firing: value %s, labels %v, summary %q", fired.Value, fired.Labels, fired.Annotations["summary"])
	require.Equal(t, "critical", fired.Labels["severity"])
	require.Contains(t, fired.Annotations["summary"], "No relay streams from the logical relay's replication slot, which keeps ")
	require.Equal(t, "docs/runbook.md#oncekitoutboxslotinactive", fired.Annotations["runbook_url"])
}

// evaluatedSince says whether Prometheus evaluated the rule alert after t.
func evaluatedSince(base, alert string, t time.Time) bool {
	resp, err := http.Get(base + "/api/v1/rules")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name           string    `json:"name"`
					LastEvaluation time.Time `json:"lastEvaluation"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if json.NewDecoder(resp.Body).Decode(&r) != nil {
		return false
	}
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			if rule.Name == alert && rule.LastEvaluation.After(t) {
				return true
			}
		}
	}
	return false
}
