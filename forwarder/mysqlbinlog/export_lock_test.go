package mysqlbinlog

import "time"

// LockName is the name of r's relay group's lock (GET_LOCK).
func LockName(r *Relay) string { return r.lockName }

// ShortLease makes r's lock lease d (whole seconds: the lock connection's wait_timeout) instead
// of lockLease.
func ShortLease(r *Relay, d time.Duration) { r.hooks.lease = d }
