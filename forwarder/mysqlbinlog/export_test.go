package mysqlbinlog

// CrashOnStop makes Run end, when its context ends, as a killed process would: without its last
// checkpoint.
func CrashOnStop(r *Relay) { r.hooks.crash = true }

// Flushes is how many checkpoints r has written.
func Flushes(r *Relay) int64 { return r.hooks.flushes.Load() }
