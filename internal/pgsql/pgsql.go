// Package pgsql is the Postgres text that the Postgres dialect of the store (store/internal/pg)
// and the log relay (forwarder/pglog) share: how the outbox keys a message id, how a schema is
// written into a statement, and the log relay's statements (logrelay.go). It sits below both so
// that each function has one copy and no package above the store's seam holds SQL of its own.
package pgsql

import (
	"crypto/md5"
	"strings"

	"github.com/google/uuid"
)

// Ident quotes name for use as an identifier in a statement: in double quotes, a double quote
// inside doubled. A schema name the dialect validated has none, so it is only enclosed.
func Ident(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// Render replaces {{schema}} in a statement with schema, quoted: every embedded statement names
// outboxkit's tables as {{schema}}.table.
func Render(schema, sql string) string { return strings.ReplaceAll(sql, "{{schema}}", Ident(schema)) }

// StoredID is how a message id is kept: a canonical lowercase UUID as itself (16 bytes, the
// primary key); any other id as the UUID-shaped md5 of its text, with the text beside it (text is
// nil for a canonical UUID). Two different ids can share a key only through an md5 collision, and
// then the second write is refused: the guard never admits a duplicate. Migration 0006 derives
// the same values in SQL.
func StoredID(id string) (key string, text any) {
	if canonicalUUID(id) {
		return id, nil
	}
	sum := md5.Sum([]byte(id))
	return uuid.UUID(sum).String(), id
}

// canonicalUUID reports whether id is a UUID in its canonical lowercase text form. On every
// insert: uuid.Parse accepts other forms too (braces, urn:, no hyphens, upper case), and telling
// them apart through its String costs an allocation per row.
func canonicalUUID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case (c < '0' || c > '9') && (c < 'a' || c > 'f'):
			return false
		}
	}
	return true
}
