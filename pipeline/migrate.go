package pipeline

import (
	"context"
	"fmt"

	"github.com/outboxkit/outboxkit/store"
)

// MigrateResult says what Migrate did.
type MigrateResult = store.MigrateResult

// Migrate creates or upgrades outboxkit's tables in s: embedded, numbered migrations of the
// store's own dialect. It is idempotent and safe to run from several processes at once, and
// refuses a database migrated by a newer build (store.ErrNewerSchema).
//
// Run it at deploy time or at service start (or `outboxctl migrate`), never from inside a
// business transaction.
func Migrate(ctx context.Context, s store.Store) (MigrateResult, error) {
	if s == nil {
		return MigrateResult{}, fmt.Errorf("pipeline.Migrate: the store is nil: pass one from store/pgxstore, pgsqlstore, " +
			"mysqlstore, sqlitestore or store.Open")
	}
	res, err := s.Migrate(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate %s (%s): %w", s.Info().Schema, s.Info().Name, err)
	}
	return res, nil
}
