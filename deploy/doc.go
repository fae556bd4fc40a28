// Package deploy ships oncekit's observability pack with the code that it
// watches:
//
//   - grafana/oncekit.json: a Grafana dashboard with a panel for every metric
//     oncekit registers (outbox relay, inbox consumers, side-effect
//     dispatcher, HTTP idempotency edge, drift checks);
//   - prometheus/alerts.yml: Prometheus alert rules, each with a runbook_url
//     into docs/runbook.md;
//   - prometheus/alerts_test.yml: promtool unit tests of those rules.
//
// The files are embedded, for tools that install them (Dashboard, Alerts).
// The package's tests fail when a metric the files use is no longer
// registered by the code, or when a registered metric has no panel, and run
// `promtool check rules` and a real Prometheus against the daemons.
package deploy

import _ "embed"

// Dashboard is the Grafana dashboard JSON (grafana/oncekit.json).
//
//go:embed grafana/oncekit.json
var Dashboard []byte

// Alerts is the Prometheus rules file (prometheus/alerts.yml).
//
//go:embed prometheus/alerts.yml
var Alerts []byte
