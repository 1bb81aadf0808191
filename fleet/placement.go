package fleet

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// placement gives each outbox the member that should relay it: rendezvous (highest random
// weight) hashing with bounded loads. Each member scores each outbox; an outbox goes to the
// member of highest score that has fewer than ⌈outboxes/members⌉ already, the outboxes taken in
// an order fixed by their own hash. Every member computes the same placement from the same
// catalog and members; a member that joins or leaves moves little more than its share (1/N),
// and no member relays more than its share, however few the outboxes.
func placement(outboxes, members []string) map[string]string {
	if len(members) == 0 {
		return nil
	}
	limit := (len(outboxes) + len(members) - 1) / len(members)
	order := slices.Clone(outboxes)
	slices.SortFunc(order, func(a, b string) int { return cmp.Or(cmp.Compare(hash(a), hash(b)), cmp.Compare(a, b)) })
	load := make(map[string]int, len(members))
	out := make(map[string]string, len(outboxes))
	ranked := slices.Clone(members)
	for _, o := range order {
		slices.SortFunc(ranked, func(a, b string) int { return cmp.Or(cmp.Compare(score(o, b), score(o, a)), cmp.Compare(a, b)) })
		for _, m := range ranked {
			if load[m] < limit {
				out[o] = m
				load[m]++
				break
			}
		}
	}
	return out
}

// score is outbox's weight at member.
func score(outbox, member string) uint64 { return hash(outbox + "\x00" + member) }

// hash is FNV-1a mixed by splitmix64's finalizer, so that names differing in one character still
// land far apart.
func hash(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
