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
	if err == nil {
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

// Transport is the former name of Unreachable.
//
// Deprecated: use Unreachable.
func Transport(err error) error { return Unreachable(err) }

// IsTransport is the former name of IsUnreachable.
//
// Deprecated: use IsUnreachable.
func IsTransport(err error) bool { return IsUnreachable(err) }
