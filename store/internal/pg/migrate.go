package pg

import (
	"context"
	"embed"
	"fmt"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one numbered step of the schema.
type Migration = sqlstore.Migration

// Migrations returns every known migration in version order.
func Migrations() []Migration { return sqlstore.ParseMigrations(migrationFiles, "migrations") }

// Migrate brings the schema to the newest version. It is idempotent and safe to run from several
// processes at once: every step runs in its own transaction that first takes a transaction-level
// advisory lock for the schema, re-checks the version table, applies the step and records its
// version row. A process that loses the race finds the version recorded and skips the step.
func Migrate(ctx context.Context, db dbexec.DB, name Name) (store.MigrateResult, error) {
	var res store.MigrateResult
	lockKey := "outboxkit.migrate." + string(name)

	bootstrap := fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[1]s.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`, name.Ident())
	if err := inLockedTx(ctx, db, lockKey, func(tx dbexec.Tx) error {
		_, err := tx.Exec(ctx, bootstrap)
		return err
	}); err != nil {
		return res, fmt.Errorf("migrate schema %s: create version table: %w", name, err)
	}

	migrations := Migrations()
	newest := migrations[len(migrations)-1].Version
	for _, m := range migrations {
		applied := false
		err := inLockedTx(ctx, db, lockKey, func(tx dbexec.Tx) error {
			var present int
			if err := tx.QueryRow(ctx,
				fmt.Sprintf(`SELECT count(*) FROM %s.schema_migrations WHERE version = $1`, name.Ident()),
				m.Version).Scan(&present); err != nil {
				return err
			}
			if present > 0 {
				return nil
			}
			if _, err := tx.Exec(ctx, name.Render(m.SQL)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx,
				fmt.Sprintf(`INSERT INTO %s.schema_migrations (version, name) VALUES ($1, $2)`, name.Ident()),
				m.Version, m.Name); err != nil {
				return err
			}
			applied = true
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("migrate schema %s: apply %04d_%s: %w", name, m.Version, m.Name, err)
		}
		if applied {
			res.Applied = append(res.Applied, m.Version)
		}
	}

	if err := db.QueryRow(ctx,
		fmt.Sprintf(`SELECT coalesce(max(version), 0) FROM %s.schema_migrations`, name.Ident()),
	).Scan(&res.Version); err != nil {
		return res, fmt.Errorf("migrate schema %s: read version: %w", name, err)
	}
	if res.Version > newest {
		return res, fmt.Errorf("migrate schema %s: the database is at version %d but this build knows "+
			"migrations up to %d: %w", name, res.Version, newest, store.ErrNewerSchema)
	}
	return res, nil
}

// Newest returns the highest migration version this build knows.
func Newest() int {
	m := Migrations()
	return m[len(m)-1].Version
}

func inLockedTx(ctx context.Context, db dbexec.DB, lockKey string, fn func(dbexec.Tx) error) (err error) {
	tx, err := db.Begin(ctx, dbexec.TxOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, lockKey); err != nil {
		return err
	}
	if err = fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
