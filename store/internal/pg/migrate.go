package pg

import (
	"context"
	"embed"
	"fmt"
	"strings"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
	"github.com/outboxkit/outboxkit/store/internal/sqlstore"
)

var sqlstoreStatements = sqlstore.Statements

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
		if strings.HasPrefix(m.SQL, noTransaction) {
			applied, err := migrateOutsideTx(ctx, db, name, lockKey, m)
			if err != nil {
				return res, fmt.Errorf("migrate schema %s: apply %04d_%s: %w", name, m.Version, m.Name, err)
			}
			if applied {
				res.Applied = append(res.Applied, m.Version)
			}
			continue
		}
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

// noTransaction marks a migration whose statements must run outside a transaction (CREATE INDEX
// CONCURRENTLY), on a large table.
const noTransaction = "-- outboxkit:no-transaction"

// ConcurrentAbove is the outbox size above which a no-transaction migration builds its indexes
// CONCURRENTLY. Below it a plain build in one transaction takes well under a second — and, unlike
// CONCURRENTLY, it waits for no transaction on other tables of the database.
var ConcurrentAbove int64 = 64 << 20

// migrateOutsideTx applies a no-transaction migration (CREATE INDEX IF NOT EXISTS statements).
// Processes serialize on a session advisory lock held by one connection; the version row is
// written after every statement succeeded, so a migration cut short runs again whole: each
// statement is idempotent, and an index a crashed CONCURRENTLY build left invalid is dropped
// first. A small outbox gets the same statements, without CONCURRENTLY, in one transaction.
func migrateOutsideTx(ctx context.Context, db dbexec.DB, name Name, lockKey string, m Migration) (bool, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return false, err
	}
	discard := true
	defer func() { conn.Release(discard) }()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, lockKey); err != nil {
		return false, err
	}
	defer func() {
		var released bool
		err := conn.QueryRow(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext($1))`, lockKey).Scan(&released)
		discard = err != nil || !released
	}()
	var present int
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.schema_migrations WHERE version = $1`, name.Ident()),
		m.Version).Scan(&present); err != nil {
		return false, err
	}
	if present > 0 {
		return false, nil
	}
	var size int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(pg_total_relation_size(to_regclass($1)), 0)`, name.Ident()+".outbox").Scan(&size); err != nil {
		return false, err
	}
	var statements []string
	for _, stmt := range sqlstoreStatements(name.Render(m.SQL)) {
		statements = append(statements, withoutLeadingComments(stmt))
	}
	record := fmt.Sprintf(`INSERT INTO %s.schema_migrations (version, name) VALUES ($1, $2)`, name.Ident())
	if size < ConcurrentAbove {
		tx, err := conn.Begin(ctx, dbexec.TxOptions{})
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		for _, stmt := range statements {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return false, err
			}
		}
		if _, err := tx.Exec(ctx, record, m.Version, m.Name); err != nil {
			return false, err
		}
		return true, tx.Commit(ctx)
	}
	for _, stmt := range statements {
		index := indexName(stmt)
		if index != "" {
			// A CONCURRENTLY build that failed or was cut short leaves an invalid index behind,
			// which IF NOT EXISTS would keep.
			var invalid bool
			err := conn.QueryRow(ctx, `SELECT coalesce((SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), false)`,
				name.Ident()+"."+index).Scan(&invalid)
			if err != nil {
				return false, err
			}
			if invalid {
				if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+name.Ident()+"."+index); err != nil {
					return false, err
				}
			}
			stmt = strings.Replace(stmt, "CREATE INDEX IF NOT EXISTS", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1)
		}
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return false, err
		}
	}
	_, err = conn.Exec(ctx, record, m.Version, m.Name)
	return err == nil, err
}

// indexName is the name a CREATE INDEX IF NOT EXISTS statement creates; "" for another statement.
func indexName(stmt string) string {
	rest, ok := strings.CutPrefix(strings.TrimSpace(stmt), "CREATE INDEX IF NOT EXISTS ")
	if !ok {
		return ""
	}
	return strings.Fields(rest)[0]
}

func withoutLeadingComments(stmt string) string {
	lines := strings.Split(stmt, "\n")
	for len(lines) > 0 && (strings.HasPrefix(strings.TrimSpace(lines[0]), "--") || strings.TrimSpace(lines[0]) == "") {
		lines = lines[1:]
	}
	return strings.Join(lines, "\n")
}
