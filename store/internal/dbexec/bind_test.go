package dbexec

import (
	"reflect"
	"testing"
)

func TestNumbered(t *testing.T) {
	cases := []struct {
		in       string
		args     []any
		out      string
		wantArgs []any
	}{
		{"SELECT ?1, ?2, ?1", []any{"a", 2}, "SELECT ?, ?, ?", []any{"a", 2, "a"}},
		{"x IN (?1) AND #1 > 0", []any{ListOf([]int64{4, 5})}, "x IN (?, ?) AND 2 > 0", []any{int64(4), int64(5)}},
		{"(#1 = 0 OR x IN (?1))", []any{List{}}, "(0 = 0 OR x IN (NULL))", []any{}},
		{"'?1 stays' -- ?2 too\n?2", []any{1, 2}, "'?1 stays' -- ?2 too\n?", []any{2}},
		{"'it''s ?1' ?1", []any{7}, "'it''s ?1' ?", []any{7}},
		{"JSON_EXTRACT(x, '$[0]') = ?10", []any{1, 2, 3, 4, 5, 6, 7, 8, 9, "ten"}, "JSON_EXTRACT(x, '$[0]') = ?", []any{"ten"}},
	}
	for _, c := range cases {
		got, args, err := Numbered(c.in, c.args)
		if err != nil || got != c.out || !reflect.DeepEqual(args, c.wantArgs) {
			t.Errorf("Numbered(%q) = %q %v %v; want %q %v", c.in, got, args, err, c.out, c.wantArgs)
		}
	}
	if _, _, err := Numbered("?3", []any{1}); err == nil {
		t.Error("a parameter past the arguments was accepted")
	}
	if _, _, err := Numbered("#1", []any{1}); err == nil {
		t.Error("#N of a parameter that is not a list was accepted")
	}
}
