// Package faults lets outboxkit's own test suites provoke a relay crash at a chosen point of a
// pass. It is internal: applications cannot reach it.
package faults

import "fmt"

// Point is where in a forwarder's pass a fault is injected.
type Point int

const (
	// BeforePublish is after claiming the pass's rows, before publishing any: a relay dying there.
	BeforePublish Point = iota
	// AfterPublish is after publishing, before marking the rows published: a crash there.
	AfterPublish
	// AfterCommit is, with a transactional publisher, after the broker committed the pass's
	// transaction, before marking its rows published.
	AfterCommit
)

// Inject makes every pass of forwarder f (a *forwarder.Forwarder) call fn at point; an error from
// fn aborts the pass there. The forwarder package sets it.
var Inject func(f any, point Point, fn func() error)

// confirmSetters are the log relays' packages' own: each sets fn on a relay of its type and
// reports whether r was one.
var confirmSetters []func(r any, fn func() error) bool

// RegisterBeforeConfirm is called by a log relay's package (forwarder/pglog, forwarder/mysqlbinlog)
// at init: set puts fn in place on r when r is that package's relay, and reports whether it was.
func RegisterBeforeConfirm(set func(r any, fn func() error) bool) {
	confirmSetters = append(confirmSetters, set)
}

// InjectBeforeConfirm makes log relay r (a *pglog.Relay or a *mysqlbinlog.Relay) call fn in every
// flush that has something to do — after publishing, before the published rows are removed and
// their position confirmed (the slot's, or the binlog relay's checkpoint) — and an error from fn
// fails the flush there, as a crash would (nothing is removed or confirmed). It panics on r of
// another type: a test's mistake.
func InjectBeforeConfirm(r any, fn func() error) {
	for _, set := range confirmSetters {
		if set(r, fn) {
			return
		}
	}
	panic(fmt.Sprintf("faults.InjectBeforeConfirm: %T is not a log relay (of a package imported here)", r))
}
