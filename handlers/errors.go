package handlers

import "github.com/outboxkit/outboxkit"

// Permanent wraps err to say that processing the message again cannot succeed: the dead-letter
// middleware dead-letters it at once instead of retrying. It is outboxkit.Permanent, the one
// marker both sides read. Permanent(nil) returns nil.
func Permanent(err error) error { return outboxkit.Permanent(err) }

// IsPermanent reports whether err, or an error it wraps, was marked with Permanent.
func IsPermanent(err error) bool { return outboxkit.IsPermanent(err) }
