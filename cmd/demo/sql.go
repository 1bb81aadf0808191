package main

import (
	"context"
	"embed"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/store"
)

//go:embed schema_*.sql
var schemas embed.FS

// business is the demo's own tables on whichever database --db names. Its statements are written
// once, with ? placeholders and {{t}}. before table names (the schema outboxkit's tables share).
type business struct {
	db     *store.DB
	prefix string
	// lag reads a consumer group's backlog in the broker; nil where the broker cannot tell.
	lag func(ctx context.Context, group string) (backends.Lag, error)
}

func newBusiness(db *store.DB) *business {
	b := &business{db: db}
	switch db.Dialect {
	case "postgres":
		b.prefix = `"` + db.Info().Schema + `".`
	case "mysql":
		b.prefix = "`" + db.Info().Schema + "`."
	}
	return b
}

// q is a statement in the database's dialect.
func (b *business) q(query string) string {
	return b.db.Rebind(strings.ReplaceAll(query, "{{t}}.", b.prefix))
}

// createTables creates the demo's tables if they are missing.
func (b *business) createTables(ctx context.Context) error {
	raw, err := schemas.ReadFile("schema_" + b.db.Dialect + ".sql")
	if err != nil {
		return fmt.Errorf("no demo tables for %s: %w", b.db.Dialect, err)
	}
	// One statement per call: MySQL's driver runs no more.
	for _, stmt := range strings.Split(string(raw), ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := b.db.SQL.ExecContext(ctx, b.q(stmt)); err != nil {
			return fmt.Errorf("create the demo's tables: %w", err)
		}
	}
	return nil
}

// now is the time the demo writes into its tables: UTC, as text on SQLite (which has no time type)
// in a form that sorts.
func (b *business) now() any {
	t := time.Now().UTC()
	if b.db.Dialect == "sqlite" {
		return t.Format("2006-01-02T15:04:05.000000Z")
	}
	return t
}

// upsertSearch is the search consumer's upsert, which MySQL spells its own way.
func (b *business) upsertSearch() string {
	if b.db.Dialect == "mysql" {
		return b.q(`INSERT INTO {{t}}.search_entries (order_id, document, updated_at) VALUES (?, ?, ?)
			ON DUPLICATE KEY UPDATE document = VALUES(document), updated_at = VALUES(updated_at)`)
	}
	return b.q(`INSERT INTO {{t}}.search_entries (order_id, document, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (order_id) DO UPDATE SET document = excluded.document, updated_at = excluded.updated_at`)
}
