//go:build latpatch

package main

import "time"

// The relay-side hooks of the breakdown: only the measurement patch of
// results/2026-12-02-latency-breakdown.txt calls them (built with -tags latpatch, with that patch
// applied to forwarder/pglog); without it the breakdown reports stages (a) and (b) together.

func (c *stageClock) relayReceived(uuid string) {
	now := time.Now()
	c.mu.Lock()
	if s := c.at(uuid); s.relayRecv.IsZero() {
		s.relayRecv = now
	}
	c.mu.Unlock()
}

func (c *stageClock) round(n int, took time.Duration) {
	c.mu.Lock()
	c.rounds = append(c.rounds, roundTimes{n, took})
	c.mu.Unlock()
}
