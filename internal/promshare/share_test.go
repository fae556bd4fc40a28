package promshare

import (
	"errors"
	"strings"
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

func TestRegisterAloneRefusesASecondComponent(t *testing.T) {
	t.Parallel()
	if err := RegisterAlone(nil, "pkg: Config.Registerer", "relay", prometheus.NewCounter(prometheus.CounterOpts{Name: "n", Help: "h"})); err != nil {
		t.Fatalf("nil registerer: %v", err)
	}
	reg := prometheus.NewRegistry()
	counter := func() prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "alone_total", Help: "A counter one component owns."})
	}
	if err := RegisterAlone(reg, "pkg: Config.Registerer", "relay", counter()); err != nil {
		t.Fatal(err)
	}
	err := RegisterAlone(reg, "pkg: Config.Registerer", "relay", counter())
	var are prometheus.AlreadyRegisteredError
	if err == nil || !errors.As(err, &are) ||
		!strings.HasPrefix(err.Error(), "pkg: Config.Registerer: metrics already registered (one relay per registerer): ") {
		t.Fatalf("second registration: %v", err)
	}
	err = RegisterAlone(reg, "pkg: Config.Registerer", "relay",
		prometheus.NewCounter(prometheus.CounterOpts{Name: "alone_total", Help: "Another help."}))
	if err == nil || errors.As(err, &are) || !strings.HasPrefix(err.Error(), "pkg: Config.Registerer: ") {
		t.Fatalf("conflicting registration: %v", err)
	}
}
