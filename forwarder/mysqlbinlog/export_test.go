package mysqlbinlog

// CrashOnStop makes Run end, when its context ends, as a killed process would: without its last
// checkpoint.
func CrashOnStop(r *Relay) { r.hooks.crash = true }

// Flushes is how many checkpoints r has written.
func Flushes(r *Relay) int64 { return r.hooks.flushes.Load() }

// RefuseLog makes every reading of the binary log fail as the server's refusal to send it from
// the relay's position would.
func RefuseLog(r *Relay) { r.hooks.refuseLog = true }

// Recoveries is how many times r recovered from a checkpoint the server could not send the log
// from.
func Recoveries(r *Relay) int64 { return r.hooks.recoveries.Load() }
