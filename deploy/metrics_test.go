package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/oncekit/oncekit/broker/natsjs"
	"github.com/oncekit/oncekit/deploy"
	"github.com/oncekit/oncekit/drift"
	"github.com/oncekit/oncekit/idempotency"
	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/internal/testkit/testenv"
	"github.com/oncekit/oncekit/outbox"
	"github.com/oncekit/oncekit/outbox/fleet"
	"github.com/oncekit/oncekit/sideeffect"
	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// recorder is a Registerer that notes the name of every metric registered
// through it.
type recorder struct {
	prometheus.Registerer
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// registeredMetrics builds every component that registers metrics, through
// its real constructor, and returns the names it registered.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	db := testenv.NewDB(t)
	nc := testenv.NewNATS(t)
	rec := &recorder{Registerer: prometheus.NewRegistry(), names: map[string]bool{}}

	pub, err := natsjs.NewPublisher(nc.Conn, nil)
	require.NoError(t, err)
	ob, err := outbox.New(&outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = outbox.NewRelay(db.Pool, ob, pub, &outbox.RelayConfig{Registerer: rec})
	require.NoError(t, err)
	lob, err := outbox.New(&outbox.Config{Schema: db.Schema, Logical: true})
	require.NoError(t, err)
	_, err = outbox.NewLogicalRelay(db.Pool, lob, pub, &outbox.LogicalRelayConfig{Registerer: rec,
		Standby: db.Pool}) // a standby's gauges too
	require.NoError(t, err)
	inbox.NewMetrics(rec, "c")
	hook, err := webhook.New(&webhook.Config{URL: "http://127.0.0.1:1/hook", Unsigned: true})
	require.NoError(t, err)
	ledger, err := sideeffect.New(&sideeffect.Config{Schema: db.Schema})
	require.NoError(t, err)
	_, err = sideeffect.NewDispatcher(db.Pool, ledger, map[string]sideeffect.Provider{"k": hook},
		&sideeffect.DispatcherConfig{Registerer: rec})
	require.NoError(t, err)
	_, err = idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema, Registerer: rec})
	require.NoError(t, err)
	_, err = drift.New(db.Pool, &drift.Config{Schema: db.Schema, Registerer: rec})
	require.NoError(t, err)
	_, err = fleet.New(nc.JS, pub, &fleet.Config{Registerer: rec})
	require.NoError(t, err)

	oncekit := map[string]bool{}
	for n := range rec.names {
		if strings.HasPrefix(n, "oncekit_") {
			oncekit[n] = true
		}
	}
	require.NotEmpty(t, oncekit)
	return oncekit
}

var metricName = regexp.MustCompile(`\boncekit_[a-z0-9_]+`)

// used returns the oncekit metric names exprs mention, with a histogram's
// _bucket, _sum and _count series mapped to its name.
func used(t *testing.T, registered map[string]bool, exprs []string) (known, unknown []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			base := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if trimmed := strings.TrimSuffix(n, suffix); trimmed != n && registered[trimmed] {
					base = trimmed
				}
			}
			if seen[base] {
				continue
			}
			seen[base] = true
			if registered[base] {
				known = append(known, base)
			} else {
				unknown = append(unknown, n)
			}
		}
	}
	sort.Strings(known)
	sort.Strings(unknown)
	return known, unknown
}

func dashboardExprs(t *testing.T) []string {
	t.Helper()
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(deploy.Dashboard, &dash))
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	require.NotEmpty(t, exprs)
	return exprs
}

// alertRule is one rule of alerts.yml.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(deploy.Alerts, &f))
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	require.NotEmpty(t, rules)
	return rules
}

func TestDashboardCoversEveryRegisteredMetric(t *testing.T) {
	t.Parallel()
	registered := registeredMetrics(t)
	known, unknown := used(t, registered, dashboardExprs(t))
	require.Empty(t, unknown, "the dashboard uses metrics the code does not register (renamed or removed?)")
	var missing []string
	for n := range registered {
		if !slices.Contains(known, n) {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "registered metrics without a dashboard panel")
}

func TestAlertsUseRegisteredMetrics(t *testing.T) {
	t.Parallel()
	registered := registeredMetrics(t)
	var exprs []string
	for _, r := range alertRules(t) {
		exprs = append(exprs, r.Expr)
		require.Equal(t, "docs/runbook.md#"+strings.ToLower(r.Alert), r.Annotations["runbook_url"], r.Alert)
	}
	known, unknown := used(t, registered, exprs)
	require.Empty(t, unknown, "alert rules use metrics the code does not register (renamed or removed?)")
	require.NotEmpty(t, known)
}

func TestEveryAlertHasARunbookSection(t *testing.T) {
	t.Parallel()
	runbook, err := os.ReadFile("../docs/runbook.md")
	require.NoError(t, err)
	for _, r := range alertRules(t) {
		require.Contains(t, string(runbook), "\n## "+r.Alert+"\n", r.Alert)
	}
}

// The check itself: a renamed metric is reported.
func TestRenamedMetricIsCaught(t *testing.T) {
	t.Parallel()
	registered := map[string]bool{"oncekit_outbox_parked": true, "oncekit_outbox_lag_seconds": true}
	_, unknown := used(t, registered, []string{
		"max(oncekit_outbox_parked_messages) > 0",
		"histogram_quantile(0.99, rate(oncekit_outbox_lag_seconds_bucket[5m]))",
	})
	require.Equal(t, []string{"oncekit_outbox_parked_messages"}, unknown)
}

func TestPromtoolChecksTheRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian: apt-get install prometheus); .ci/run installs it")
	}
	for _, args := range [][]string{
		{"check", "rules", "prometheus/alerts.yml"},
		{"test", "rules", "prometheus/alerts_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
		require.Contains(t, string(out), "SUCCESS")
	}
}
