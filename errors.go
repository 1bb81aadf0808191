package outboxkit

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// unreachableError marks an error as "a dependency could not be reached" (the broker, the database,
// a service a handler calls): the message itself is not at fault, so retrying it later is expected
// to succeed.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return "unreachable: " + e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// Unreachable wraps err to say that the work failed because a dependency could not be reached
// (connection refused or lost, channel closed, confirm timed out), not because of the message.
// The forwarder opens its circuit on such errors and does not count them against a message's
// attempts, so a broker outage delays messages instead of dead-lettering them; a consumer's
// middleware.Circuit holds the message the same way when a handler returns one (a payment
// gateway down, say), and never counts it toward the message's deliveries.
//
// Unreachable(nil) returns nil.
func Unreachable(err error) error {
	if err == nil {
		return nil
	}
	if IsUnreachable(err) {
		return err
	}
	return &unreachableError{err: err}
}

// IsUnreachable reports whether err means a dependency could not be reached. It recognises errors
// wrapped with Unreachable and the standard library's network failures: net.Error, refused or reset
// connections, broken pipes, unexpected EOF and context deadlines (a confirm that never came).
func IsUnreachable(err error) bool {
	if err == nil || IsAccessDenied(err) {
		return false
	}
	var te *unreachableError
	if errors.As(err, &te) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// accessDeniedError marks an error as a dependency refusing the program's credentials or
// permissions.
type accessDeniedError struct{ err error }

func (e *accessDeniedError) Error() string { return "access denied: " + e.err.Error() }
func (e *accessDeniedError) Unwrap() error { return e.err }

// AccessDenied wraps err to say that a dependency refused the program's credentials or
// permissions: a wrong password, a user without the rights it needs, a virtual host it may not
// use. That is not an outage — trying again will not help until the configuration changes — and
// not the message's fault: the forwarder and the consumer middleware hold their messages, say so
// loudly at every attempt, and report it where they can at start (forwarder.Run, a subscriber's
// first Subscribe). AccessDenied(nil) returns nil.
func AccessDenied(err error) error {
	if err == nil || IsAccessDenied(err) {
		return err
	}
	return &accessDeniedError{err: err}
}

// IsAccessDenied reports whether err was marked with AccessDenied.
func IsAccessDenied(err error) bool {
	var ad *accessDeniedError
	return errors.As(err, &ad)
}

// permanentError marks an error that no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err to say that trying the message again cannot succeed: a payload no consumer
// can decode, a message the broker can never take (too large, unroutable, an invalid subject).
// The forwarder dead-letters such a row at once instead of backing it off; a consumer's dead-letter
// middleware dead-letters such a message at once instead of retrying it. Permanent(nil) returns
// nil.
func Permanent(err error) error {
	if err == nil || IsPermanent(err) {
		return err
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// fencedError marks an error as the program having been replaced by a newer instance of itself.
type fencedError struct{ err error }

func (e *fencedError) Error() string { return "fenced: " + e.err.Error() }
func (e *fencedError) Unwrap() error { return e.err }

// Fenced wraps err to say that a newer instance of the program took over what this one did and
// the broker or database now refuses this one for good: a Kafka transactional relay whose
// transactional id another relay of its group initialised since (Kafka's ProducerFenced). That is
// not an outage: this instance must stop, and its successor carries on. The forwarder's Run
// returns it. Fenced(nil) returns nil.
func Fenced(err error) error {
	if err == nil || IsFenced(err) {
		return err
	}
	return &fencedError{err: err}
}

// IsFenced reports whether err, or an error it wraps, was marked with Fenced.
func IsFenced(err error) bool {
	var f *fencedError
	return errors.As(err, &f)
}
