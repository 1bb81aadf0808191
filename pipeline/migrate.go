package pipeline

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outboxkit/internal/schema"
)

// DefaultSchema is the Postgres schema that holds outboxkit's tables unless configured otherwise.
const DefaultSchema = schema.Default

// MigrateResult says what Migrate did.
type MigrateResult = schema.MigrateResult

// Migrate creates or upgrades outboxkit's tables in the given Postgres schema ("" means
// DefaultSchema). It is idempotent and safe to run from several processes at once: each numbered
// migration runs in its own transaction under an advisory lock, together with its version row.
//
// Run it at deploy time or at service start, never from inside a business transaction. With pgx,
// pass stdlib.OpenDBFromPool(pool).
func Migrate(ctx context.Context, db *sql.DB, schemaName string) (MigrateResult, error) {
	name, err := schema.Parse(schemaName)
	if err != nil {
		return MigrateResult{}, err
	}
	return schema.Migrate(ctx, db, name)
}
