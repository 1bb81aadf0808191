package pgtext_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outboxkit/outboxkit/internal/pgtext"
)

func TestStorable(t *testing.T) {
	if got := pgtext.Storable("a\x00b\xffc"); got != "ab\uFFFDc" {
		t.Errorf("got %q", got)
	}
	long := strings.Repeat("é", pgtext.MaxLen) // 2 bytes each: the cut falls inside a rune
	got := pgtext.Storable(long)
	if !utf8.ValidString(got) || len(got) > pgtext.MaxLen+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("long text stored as %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
