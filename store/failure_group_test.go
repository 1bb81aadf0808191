package store

import "testing"

func TestNormalizeError(t *testing.T) {
	cases := []struct{ in, want string }{
		{`decode OrderPlaced: invalid character 'x' looking for beginning of value`,
			`decode OrderPlaced: invalid character '‹…›' looking for beginning of value`},
		{`customer "c-0042" has no billing account (--reject-customer)`,
			`customer "‹…›" has no billing account (--reject-customer)`},
		{`delivered 7 times without finishing (at most 5 allowed): the handler may be crashing the process`,
			`delivered ‹n› times without finishing (at most ‹n› allowed): the handler may be crashing the process`},
		{`failed on delivery 5 of 5: charge order-18231: gateway answered 409 Conflict`,
			`failed on delivery ‹n› of ‹n›: charge order-‹n›: gateway answered ‹n› Conflict`},
		{`publish to shop.orders: message 0190f7e2-5c1a-7b3e-9d0a-2f4c6b8e1a3d rejected: payload too large (1049213 bytes > 1048576)`,
			`publish to shop.orders: message ‹id› rejected: payload too large (‹n› bytes > ‹n›)`},
		{`dial tcp 10.0.3.7:5672: connect: connection refused`, `dial tcp ‹addr›: connect: connection refused`},
		{`notify ana.lopez@example.com at 2026-11-30T03:12:44.120Z: mailbox full`, `notify ‹email› at ‹time›: mailbox full`},
		{"trace 4bf92f3577b34da6a3ce929d0e0e4736 sku SKU-977 rule #12 violated", "trace ‹id› sku SKU-‹n› rule #‹n› violated"},
		{"  two\n\tlines  ", "two lines"},
	}
	for _, c := range cases {
		if got := NormalizeError(c.in); got != c.want {
			t.Errorf("NormalizeError(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
	long := make([]byte, 1000)
	for i := range long {
		long[i] = 'a' + byte(i%26)
	}
	if got := []rune(NormalizeError(string(long))); len(got) != MaxPatternLen+1 {
		t.Errorf("a 1000-rune error normalises to %d runes, want %d and an ellipsis", len(got), MaxPatternLen+1)
	}
}

// Errors that differ only by values share a group; another event type or another cause does not.
func TestFailureGroupOf(t *testing.T) {
	a, pa := FailureGroupOf("OrderPlaced", `customer "c-1" has no billing account`)
	b, pb := FailureGroupOf("OrderPlaced", `customer "c-2" has no billing account`)
	c, _ := FailureGroupOf("OrderPaid", `customer "c-1" has no billing account`)
	d, _ := FailureGroupOf("OrderPlaced", `customer "c-1" is blocked`)
	if a != b || pa != pb {
		t.Errorf("same cause, other value: %d (%q) != %d (%q)", a, pa, b, pb)
	}
	if a == c || a == d {
		t.Errorf("another event type or cause shares group %d", a)
	}
	// The id is pinned: every driver and every release with this NormalizerVersion computes it.
	const pinned = 4274570661736673492
	if a != pinned {
		t.Errorf("FailureGroupOf(OrderPlaced, customer…) = %d, want %d: the ids changed without a NormalizerVersion bump", a, int64(pinned))
	}
}
