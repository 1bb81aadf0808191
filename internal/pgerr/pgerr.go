// Package pgerr reads Postgres error details from either driver outboxkit supports (pgx, also
// behind database/sql, and lib/pq), so each seam translates driver errors in one place. It does not
// import lib/pq: its errors are read through the SQLState method they share with pgx's, so that
// only the teams that chose lib/pq compile it.
package pgerr

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes outboxkit reacts to.
const (
	UniqueViolation     = "23505"
	UndefinedTable      = "42P01"
	InFailedTransaction = "25P02"
	AdminShutdown       = "57P01"
	CrashShutdown       = "57P02"
	CannotConnectNow    = "57P03"
	TooManyConnections  = "53300"
)

// Code returns the SQLSTATE of a Postgres error and the constraint it names, or "" when err does
// not come from the server.
func Code(err error) (code, constraint string) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code, pgErr.ConstraintName
	}
	var stateErr interface {
		error
		SQLState() string
	}
	if errors.As(err, &stateErr) {
		return stateErr.SQLState(), constraintOf(stateErr)
	}
	return "", ""
}

// constraintOf reads the Constraint field of lib/pq's *pq.Error (which has no method for it).
func constraintOf(err error) string {
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return ""
	}
	if f := v.FieldByName("Constraint"); f.IsValid() && f.Kind() == reflect.String {
		return f.String()
	}
	return ""
}

// AccessDenied reports whether the server refused the credentials or the permissions of the
// session: SQLSTATE class 28 (invalid authorization: a wrong password, no such role, pg_hba
// refusing it) or 42501 (insufficient privilege).
func AccessDenied(err error) bool {
	code, _ := Code(err)
	return strings.HasPrefix(code, "28") || code == "42501"
}

// IsUnreachable reports whether err means the database could not be reached, or dropped the
// session, rather than that it refused the statement: a failed connect, a connection lost or
// reset, the server shutting down, starting up or out of connection slots (SQLSTATE class 08,
// 57P01-57P03, 53300). Work that failed so is expected to succeed once the database is back.
func IsUnreachable(err error) bool {
	if err == nil || AccessDenied(err) {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) || pgconn.SafeToRetry(err) || errors.Is(err, driver.ErrBadConn) {
		return true
	}
	switch code, _ := Code(err); {
	case strings.HasPrefix(code, "08"), code == AdminShutdown, code == CrashShutdown, code == CannotConnectNow,
		code == TooManyConnections:
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}
