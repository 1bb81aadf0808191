package dbtext_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outboxkit/outboxkit/internal/dbtext"
)

func TestStorable(t *testing.T) {
	if got := dbtext.Storable("a\x00b\xffc"); got != "ab\uFFFDc" {
		t.Errorf("got %q", got)
	}
	long := strings.Repeat("é", dbtext.MaxLen) // 2 bytes each: the cut falls inside a rune
	got := dbtext.Storable(long)
	if !utf8.ValidString(got) || len(got) > dbtext.MaxLen+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("long text stored as %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
