package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/sideeffect"
)

// start runs a process until the test ends, showing its output if the test
// fails.
func start(t *testing.T, name string, env []string, bin string, args ...string) {
	t.Helper()
	out := &testenv.SyncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out)
		}
	})
}

// promResult is the part of a Prometheus API answer the test reads.
type promResult struct {
	Status string `json:"status"`
	Data   struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
		Groups []struct {
			Rules []struct {
				Name   string `json:"name"`
				Health string `json:"health"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"data"`
}

func promGet(t *testing.T, base, path string) (promResult, bool) {
	var r promResult
	resp, err := http.Get(base + path)
	if err != nil {
		return r, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil {
		return r, false
	}
	return r, r.Status == "success"
}

// A real Prometheus scrapes a relay and a dispatcher started from the
// oncekit binary, loads the alert rules, and answers queries on their series.
func TestPrometheusScrapesTheDaemons(t *testing.T) {
	t.Parallel()
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (Debian: apt-get install prometheus); .ci/run installs it")
	}
	db := testenv.NewDB(t)
	nats := testenv.NewNATS(t)
	bin := testenv.OncekitBinary(t)
	env := []string{"DATABASE_URL=" + db.URL, "ONCEKIT_SCHEMA=" + db.Schema, "NATS_URL=" + nats.URL}

	// An effect for the dispatcher to confirm against a local receiver.
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(receiver.Close)
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ledger.Record(ctx, tx, sideeffect.Effect{SourceID: "p1", Kind: "receipt", Payload: []byte(`{}`)})
		return err
	}))

	// Four partitions, stated in the database as the migrations do.
	_, err = db.Pool.Exec(ctx, `DELETE FROM relay_partitions WHERE partition >= 4`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE outbox_epoch SET partitions = 4`)
	require.NoError(t, err)
	relayAddr, dispatchAddr, promAddr := testenv.FreeAddr(t), testenv.FreeAddr(t), testenv.FreeAddr(t)
	name := testenv.Name(t)
	start(t, "relay", env, bin, "relay", "--listen", relayAddr,
		"--stream", name, "--subjects", name+".>")
	start(t, "dispatch", env, bin, "dispatch", "--listen", dispatchAddr, "--poll-interval", "50ms",
		"--endpoint", "receipt="+receiver.URL+"/hook", "--unsigned")

	dir := t.TempDir()
	rules, err := filepath.Abs("prometheus/alerts.yml")
	require.NoError(t, err)
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: relay
    static_configs: [{targets: [%q]}]
  - job_name: dispatch
    static_configs: [{targets: [%q]}]
`, rules, relayAddr, dispatchAddr)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600))
	start(t, "prometheus", nil, promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	base := "http://" + promAddr

	query := func(q string) func() bool {
		return func() bool {
			r, ok := promGet(t, base, "/api/v1/query?query="+url.QueryEscape(q))
			return ok && len(r.Data.Result) > 0
		}
	}
	require.Eventually(t, query(`oncekit_outbox_partitions_owned{job="relay"} == 4`), 60*time.Second, 250*time.Millisecond,
		"the relay's gauge reaches Prometheus")
	require.Eventually(t, query(`oncekit_sideeffect_transitions_total{job="dispatch",kind="receipt",state="confirmed"} == 1`),
		60*time.Second, 250*time.Millisecond, "the dispatcher's counter reaches Prometheus")

	r, ok := promGet(t, base, "/api/v1/rules")
	require.True(t, ok)
	var loaded int
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			require.NotEqual(t, "err", rule.Health, rule.Name)
			loaded++
		}
	}
	require.Equal(t, len(alertRules(t)), loaded, "every alert rule is loaded")
}
