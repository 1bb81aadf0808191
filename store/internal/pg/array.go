package pg

import (
	"database/sql/driver"
	"strconv"
	"strings"
)

// int64Array and textArray send a Go slice as a Postgres array literal ({1,2}, {"a","b"}), which
// every database/sql driver for Postgres passes through unchanged for an array parameter — lib/pq
// and pgx's stdlib alike. They replace lib/pq's pq.Array so that the database/sql store does not
// make its users compile lib/pq (pgx's driver has no database/sql array type of its own).
type int64Array []int64

func (a int64Array) Value() (driver.Value, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(v, 10))
	}
	b.WriteByte('}')
	return b.String(), nil
}

type textArray []string

func (a textArray) Value() (driver.Value, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		// Every element is quoted, so that NULL, empty strings, commas and braces stay text; inside
		// the quotes only " and \ need a backslash.
		b.WriteByte('"')
		for _, r := range v {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), nil
}
