// Package pgerr reads Postgres error details from either driver outboxkit supports (pgx, also
// behind database/sql, and lib/pq), so each seam translates driver errors in one place.
package pgerr

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lib/pq"
)

// SQLSTATE codes outboxkit reacts to.
const (
	UniqueViolation      = "23505"
	UndefinedTable       = "42P01"
	InFailedTransaction  = "25P02"
	AdminShutdown        = "57P01"
	QueryCanceled        = "57014"
	IdleInTxTimeout      = "25P03"
	SerializationFailure = "40001"
	DeadlockDetected     = "40P01"
)

// Code returns the SQLSTATE of a Postgres error and the constraint it names, or "" when err does
// not come from the server.
func Code(err error) (code, constraint string) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code, pgErr.ConstraintName
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		return string(pqErr.Code), pqErr.Constraint
	}
	return "", ""
}
