// Package dbtext makes arbitrary text storable in a text column of any store.
package dbtext

import (
	"strings"
	"unicode/utf8"
)

// MaxLen bounds stored error texts: enough to diagnose, never a payload's worth.
const MaxLen = 2000

// Storable returns s as valid UTF-8 without NUL bytes (stores reject both in text), cut to
// MaxLen bytes on a rune boundary with an ellipsis.
func Storable(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > MaxLen {
		s = s[:MaxLen]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return s
}
