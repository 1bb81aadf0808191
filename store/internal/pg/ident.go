package pg

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/outboxkit/outboxkit/internal/pgsql"
)

// Default is the Postgres schema that holds outboxkit's tables unless configured otherwise.
const Default = "outboxkit"

var validName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,49}$`)

// Name is a validated Postgres schema name.
type Name string

// Parse validates name, returning Default for "".
func Parse(name string) (Name, error) {
	if name == "" {
		return Default, nil
	}
	if !validName.MatchString(name) {
		return "", fmt.Errorf("schema name %q is not usable: use lowercase letters, digits and underscores, "+
			"start with a letter or underscore, at most 50 characters (default %q)", name, Default)
	}
	return Name(name), nil
}

// MustParse is Parse for names known to be valid; it panics otherwise.
func MustParse(name string) Name {
	n, err := Parse(name)
	if err != nil {
		panic(err)
	}
	return n
}

// Ident is the schema quoted for use in SQL.
func (n Name) Ident() string { return pgsql.Ident(string(n)) }

// NotifyChannel is the LISTEN/NOTIFY channel on which writers wake the relays of this schema.
func (n Name) NotifyChannel() string { return string(n) + "_outbox" }

// Render replaces {{schema}} in a SQL text with the quoted schema name, and {{schema_name}} and
// {{notify_channel}} (written inside a string literal, as a function body names them) with the
// schema's bare name and NotifyChannel: a valid name has no quote to escape.
func (n Name) Render(sql string) string {
	sql = strings.ReplaceAll(sql, "{{schema_name}}", string(n))
	sql = strings.ReplaceAll(sql, "{{notify_channel}}", n.NotifyChannel())
	return pgsql.Render(string(n), sql)
}
