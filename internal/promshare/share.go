package promshare

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg and returns it; when reg already holds a
// collector of c's type under c's description, it returns that one, so that
// several components on one registerer share their series. Any other
// registration error is joined into *errp, and c is returned.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	*errp = errors.Join(*errp, err)
	return c
}

// RegisterAlone registers cs with reg for a component that runs one to a
// registerer (the outbox relay, the HTTP edge); a nil reg registers nothing.
// field names the Config field the registerer came from ("outbox:
// RelayConfig.Registerer") and one the component ("relay"): a collector
// already registered is the error "<field>: metrics already registered (one
// <one> per registerer)", wrapping the registry's error.
func RegisterAlone(reg prometheus.Registerer, field, one string, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("%s: metrics already registered (one %s per registerer): %w", field, one, err)
			}
			return fmt.Errorf("%s: %w", field, err)
		}
	}
	return nil
}
