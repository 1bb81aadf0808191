package prom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// register registers *c in reg, or replaces *c with the collector already registered under the
// same description. It does nothing once *errp is set, so a run of calls reports the first error.
func register[T prometheus.Collector](reg prometheus.Registerer, c *T, errp *error) {
	if *errp != nil {
		return
	}
	if err := reg.Register(*c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				*c = existing
				return
			}
		}
		*errp = err
	}
}
