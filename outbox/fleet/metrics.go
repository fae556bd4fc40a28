package fleet

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/internal/promshare"
)

// metrics are the fleet's Prometheus series (namespace oncekit, subsystem
// fleet). The database label takes only the names of the configured set;
// a database's series are deleted when it leaves the set.
type metrics struct {
	members, owned prometheus.Gauge
	up             *prometheus.GaugeVec
	failures       *prometheus.CounterVec
	budget         *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "oncekit", "fleet"
	db := []string{"database"}
	m := &metrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "members", Help: "Live fleet members this member sees, itself included."}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "databases_owned", Help: "Databases assigned to this member."}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "database_up", Help: "1 while this member's relay of the database runs and its last check reached the database, 0 while it is backed off (its breaker open)."}, db),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "database_failures_total", Help: "Failed starts and checks of a database's relay (unreachable, refusing, too slow, wrong credentials, no migrations)."}, db),
		budget: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "database_connections_budget", Help: "The most connections this member opens to the database (its pool's MaxConns)."}, db),
	}
	if err := promshare.RegisterAlone(reg, "fleet: Config.Registerer", "fleet",
		m.members, m.owned, m.up, m.failures, m.budget); err != nil {
		return nil, err
	}
	return m, nil
}

// forget deletes database's series.
func (m *metrics) forget(database string) {
	m.up.DeleteLabelValues(database)
	m.failures.DeleteLabelValues(database)
	m.budget.DeleteLabelValues(database)
}

// scoped is a Registerer that adds a database label to what it registers
// and unregisters all of it on release: a database's relay series live as
// long as this member serves it.
type scoped struct {
	reg prometheus.Registerer
	mu  sync.Mutex
	cs  []prometheus.Collector
}

func newScoped(reg prometheus.Registerer, database string) *scoped {
	if reg == nil {
		return nil
	}
	return &scoped{reg: prometheus.WrapRegistererWith(prometheus.Labels{"database": database}, reg)}
}

func (s *scoped) Register(c prometheus.Collector) error {
	if err := s.reg.Register(c); err != nil {
		return err
	}
	s.mu.Lock()
	s.cs = append(s.cs, c)
	s.mu.Unlock()
	return nil
}

func (s *scoped) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := s.Register(c); err != nil {
			panic(err)
		}
	}
}

func (s *scoped) Unregister(c prometheus.Collector) bool { return s.reg.Unregister(c) }

// release unregisters everything registered through s.
func (s *scoped) release() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cs {
		s.reg.Unregister(c)
	}
	s.cs = nil
}
