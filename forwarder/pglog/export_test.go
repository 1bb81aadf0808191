package pglog

// CrashOnStop makes Run end, when its context ends, as a killed process would: nothing flushed,
// nothing confirmed.
func CrashOnStop(r *Relay) { r.hooks.crash = true }
