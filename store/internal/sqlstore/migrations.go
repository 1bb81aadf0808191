package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/outboxkit/outboxkit/store"
)

// Migration is one numbered step of a dialect's schema.
type Migration struct {
	Version int
	Name    string
	SQL     string // with the dialect's {{schema}} placeholders
}

// ParseMigrations reads the migrations of dir in fsys, files named NNNN_name.sql, in version
// order. A misnamed file is a bug of the build: it panics.
func ParseMigrations(fsys fs.FS, dir string) []Migration {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		panic(fmt.Sprintf("read embedded migrations: %v", err))
	}
	var out []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic(fmt.Sprintf("migration file %q is not named NNNN_name.sql", e.Name()))
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			panic(fmt.Sprintf("read migration %q: %v", e.Name(), err))
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// Statements splits a migration into its statements, for databases whose drivers run one at a
// time: statements end with a semicolon at the end of a line. Comment-only pieces are dropped.
func Statements(sql string) []string {
	var out []string
	for _, piece := range strings.Split(sql, ";\n") {
		keep := false
		for _, line := range strings.Split(piece, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
				keep = true
				break
			}
		}
		if keep {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(piece), ";"))
		}
	}
	return out
}

func (s *Store) Migrate(ctx context.Context) (store.MigrateResult, error) {
	res, err := s.d.Migrate(ctx, s.db)
	return res, s.d.Classify(err)
}

func (s *Store) SchemaVersion(ctx context.Context) (current, newest int, err error) {
	current, newest, err = s.d.SchemaVersion(ctx, s.db)
	if err != nil {
		if err = s.d.Classify(err); errors.Is(err, store.ErrNotMigrated) {
			return 0, newest, nil
		}
	}
	return current, newest, err
}

func (s *Store) CheckSchema(ctx context.Context) error {
	current, newest, err := s.d.SchemaVersion(ctx, s.db)
	if err != nil {
		if err = s.d.Classify(err); !errors.Is(err, store.ErrNotMigrated) {
			return fmt.Errorf("read the schema version of %s: %w", s.d.Info().Schema, err)
		}
		current = 0
	}
	return store.CheckVersion(s.d.Info().Schema, current, newest)
}
