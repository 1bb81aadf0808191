package store

import (
	"context"
	"time"
)

// Committer is a Store that records rows published by seq, whoever claimed them. A relay that
// publishes in broker transactions (forwarder, with a transactional publisher) uses it to record
// what its last transaction committed when the relay that committed it died before recording it:
// the broker's record of that transaction, not a claim, says the rows are published.
type Committer interface {
	// MarkCommitted marks the pending rows among seqs published at now (deleted instead, with
	// deleteRows) and returns how many it marked. Rows already published, dead-lettered or gone are
	// left as they are: marking twice is harmless. A claim or lease another relay holds on a row
	// does not keep it from being marked.
	MarkCommitted(ctx context.Context, seqs []int64, now time.Time, deleteRows bool) (int, error)
}

// CommitterOf is ConsoleOf for Committer.
func CommitterOf(s Store) (Committer, bool) {
	if d, ok := s.(*DB); ok {
		s = d.Driver
	}
	c, ok := s.(Committer)
	return c, ok
}
