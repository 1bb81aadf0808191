package prom

import "time"

// SetClock replaces the clock that decides whether a scrape shares the last read of the fleet.
func (m *FleetMetrics) SetClock(now func() time.Time) { m.now = now }
