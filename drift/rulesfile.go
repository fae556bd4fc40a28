package drift

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"
)

// fileDuration reads "90s"-style durations from YAML.
type fileDuration struct{ d *time.Duration }

func (f *fileDuration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	if d < 0 {
		return fmt.Errorf("line %d: %s is negative", n.Line, s)
	}
	d2 := d
	f.d = &d2
	return nil
}

// file is the YAML form of a rules file.
type file struct {
	MaxOutboxAge     fileDuration `yaml:"max_outbox_age"`
	MaxOutboxBacklog *int64       `yaml:"max_outbox_backlog"`
	Slot             string       `yaml:"slot"`
	MaxSlotLag       *int64       `yaml:"max_slot_lag_bytes"`
	MaxSlotRetained  *int64       `yaml:"max_inactive_slot_retained_bytes"`
	MaxPendingAge    fileDuration `yaml:"max_pending_age"`
	LeaseGrace       fileDuration `yaml:"lease_grace"`
	FailedWindow     fileDuration `yaml:"failed_window"`
	Window           fileDuration `yaml:"window"`
	CheckTimeout     fileDuration `yaml:"check_timeout"`
	Skip             []string     `yaml:"skip"`
	Rules            []struct {
		Name   string `yaml:"name"`
		SQL    string `yaml:"sql"`
		Expect *struct {
			Kind       string `yaml:"kind"`
			Sources    string `yaml:"sources"`
			BusinessID string `yaml:"business_id"`
		} `yaml:"expect"`
	} `yaml:"rules"`
	Horizons []struct {
		Consumer string       `yaml:"consumer"`
		Horizon  fileDuration `yaml:"horizon"`
		Since    time.Time    `yaml:"since"`
	} `yaml:"horizons"`
}

// ErrInvalidRules is returned by ReadRules for a file it cannot use.
var ErrInvalidRules = errors.New("drift: invalid rules file")

// ReadRules reads a YAML rules file into cfg: the thresholds it sets replace
// cfg's, and its skipped checks, rules and horizons are appended to cfg's. Unknown keys are
// errors. The format, with every key optional:
//
//	max_outbox_age: 1m
//	max_outbox_backlog: 100000
//	slot: oncekit_app                          # the logical relay's slot (default oncekit_ and the schema)
//	max_slot_lag_bytes: 1000000000
//	max_inactive_slot_retained_bytes: 100000000
//	max_pending_age: 5m
//	lease_grace: 1m
//	failed_window: 24h
//	window: 24h          # bounds what expectations read; {since} in SQL
//	check_timeout: 30s
//	skip: [effects_failed]   # built-in checks to leave out
//	rules:
//	  - name: orders_without_invoice
//	    sql: SELECT id FROM orders o WHERE NOT EXISTS (SELECT 1 FROM invoices i WHERE i.order_id = o.id)
//	  - name: payment_captures
//	    expect:
//	      kind: payment.capture
//	      sources: SELECT id FROM payments WHERE created_at >= {since}
//	      business_id: $.payment_id   # JSON path in the payload; default source_id
//	horizons:
//	  - consumer: payments
//	    horizon: 168h
//	    since: 2026-01-31T00:00:00Z   # when the consumer first ran (optional)
func ReadRules(r io.Reader, cfg *Config) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRules, err)
	}
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %v", ErrInvalidRules, err)
	}
	for _, d := range []struct {
		from fileDuration
		to   *time.Duration
	}{{f.MaxOutboxAge, &cfg.MaxOutboxAge}, {f.MaxPendingAge, &cfg.MaxPendingAge}, {f.LeaseGrace, &cfg.LeaseGrace},
		{f.FailedWindow, &cfg.FailedWindow}, {f.Window, &cfg.Window}, {f.CheckTimeout, &cfg.CheckTimeout}} {
		if d.from.d != nil {
			*d.to = *d.from.d
		}
	}
	if f.MaxOutboxBacklog != nil {
		cfg.MaxOutboxBacklog = *f.MaxOutboxBacklog
	}
	for _, n := range []struct {
		from *int64
		to   *int64
		key  string
	}{{f.MaxSlotLag, &cfg.MaxSlotLagBytes, "max_slot_lag_bytes"}, {f.MaxSlotRetained, &cfg.MaxInactiveSlotRetainedBytes, "max_inactive_slot_retained_bytes"}} {
		if n.from != nil {
			if *n.from < 0 {
				return fmt.Errorf("%w: %s is negative", ErrInvalidRules, n.key)
			}
			*n.to = *n.from
		}
	}
	if f.Slot != "" {
		cfg.Slot = f.Slot
	}
	cfg.Skip = append(cfg.Skip, f.Skip...)
	for i, r := range f.Rules {
		rule := Rule{Name: r.Name, SQL: r.SQL}
		if r.Expect != nil {
			if r.SQL != "" {
				return fmt.Errorf("%w: rules[%d] (%s): give sql or expect, not both", ErrInvalidRules, i, r.Name)
			}
			rule.Expect = &Expectation{Kind: r.Expect.Kind, SourcesSQL: r.Expect.Sources, BusinessID: r.Expect.BusinessID}
		}
		if err := rule.validate(); err != nil {
			return fmt.Errorf("%w: rules[%d]: %v", ErrInvalidRules, i, err)
		}
		cfg.Rules = append(cfg.Rules, rule)
	}
	for i, h := range f.Horizons {
		if h.Consumer == "" || h.Horizon.d == nil || *h.Horizon.d <= 0 {
			return fmt.Errorf("%w: horizons[%d]: want consumer and a positive horizon", ErrInvalidRules, i)
		}
		cfg.Horizons = append(cfg.Horizons, Horizon{Consumer: h.Consumer, Horizon: *h.Horizon.d, Since: h.Since})
	}
	return nil
}
