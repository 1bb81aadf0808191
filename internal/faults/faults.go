// Package faults lets outboxkit's own test suites provoke a relay crash at a chosen point of a
// pass. It is internal: applications cannot reach it.
package faults

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

// InjectBeforeConfirm makes log relay r (a *pglog.Relay) call fn in every flush that has something
// to do — after publishing, before the published rows are removed and their position confirmed —
// and an error from fn fails the flush there, as a crash would (nothing is removed or confirmed).
// The pglog package sets it.
var InjectBeforeConfirm func(r any, fn func() error)
