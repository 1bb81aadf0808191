package pglog

import "context"

// CrashOnStop makes Run end, when its context ends, as a killed process would: nothing flushed,
// nothing confirmed.
func CrashOnStop(r *Relay) { r.hooks.crash = true }

// HideRowsFromFlushes makes r's next n flushes that remove rows remove none, as a snapshot taken
// before the rows' commits were visible would.
func HideRowsFromFlushes(r *Relay, n int) { r.hooks.hideRows = n }

// WaitVisible is the dispatcher's wait for transactions the log sent as committed.
func WaitVisible(ctx context.Context, r *Relay, xids []uint32) error {
	return (&dispatcher{s: &session{r: r}}).waitVisible(ctx, xids)
}

// ParkedChecks is how many times r's dispatcher has read its parked keys from the table.
func ParkedChecks(r *Relay) int64 { return r.hooks.checks.Load() }

// AfterCommit makes fn run after each transaction r commits, before its checkpoint. With
// CrashOnStop, an fn that ends Run's context stops r there, as a killed process would.
func AfterCommit(r *Relay, fn func()) { r.hooks.afterCommit = fn }
