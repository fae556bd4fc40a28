package promshare

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterSharesTheFirstCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "shared_total", Help: "A counter two components share."}
	var err error
	first := Register(reg, prometheus.NewCounterVec(opts, []string{"kind"}), &err)
	second := Register(reg, prometheus.NewCounterVec(opts, []string{"kind"}), &err)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatal("the second registration did not return the first collector")
	}
}

func TestRegisterJoinsOtherErrors(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var err error
	Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "clash", Help: "One help."}), &err)
	Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "clash", Help: "Another help."}), &err)
	Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "clash_too", Help: "x"}), &err)
	Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "clash_too", Help: "y"}), &err)
	if err == nil {
		t.Fatal("conflicting registrations returned no error")
	}
}
