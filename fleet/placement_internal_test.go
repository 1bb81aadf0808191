package fleet

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

func names(pattern string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(pattern, i)
	}
	return out
}

// Each member gets its share, within one, however few the outboxes.
func TestPlacement_EachMemberGetsItsShare(t *testing.T) {
	for _, c := range []struct{ outboxes, members int }{{12, 3}, {12, 5}, {3, 5}, {200, 7}, {1, 1}} {
		members := names("member-%d", c.members)
		p := placement(names("tenant-%d", c.outboxes), members)
		rev := slices.Clone(members)
		slices.Reverse(rev)
		if q := placement(names("tenant-%d", c.outboxes), rev); !maps.Equal(p, q) {
			t.Errorf("%d outboxes over %d members: the placement depends on the order of the members", c.outboxes, c.members)
		}
		load := map[string]int{}
		for _, m := range p {
			load[m]++
		}
		if len(p) != c.outboxes {
			t.Errorf("%d outboxes over %d members: %d placed", c.outboxes, c.members, len(p))
		}
		limit := (c.outboxes + c.members - 1) / c.members
		for _, m := range members {
			n := load[m]
			if n > limit || (c.outboxes >= c.members && n < c.outboxes/c.members-1) {
				t.Errorf("%d outboxes over %d members: %s has %d, want %d or %d", c.outboxes, c.members, m, n, limit-1, limit)
			}
		}
	}
}

// A member that joins or leaves moves little more than its share.
func TestPlacement_AJoinMovesAboutItsShare(t *testing.T) {
	outboxes := names("tenant-%d", 200)
	for n := 2; n <= 8; n++ {
		before := placement(outboxes, names("member-%d", n))
		after := placement(outboxes, names("member-%d", n+1))
		moved := 0
		for o, m := range before {
			if after[o] != m {
				moved++
			}
		}
		share := len(outboxes) / (n + 1)
		t.Logf("%d → %d members: %d of %d outboxes moved (the newcomer's share: %d)", n, n+1, moved, len(outboxes), share)
		if moved > 2*share {
			t.Errorf("%d → %d members: %d outboxes moved, want about %d", n, n+1, moved, share)
		}
	}
}
