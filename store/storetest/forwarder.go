package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// forwarderTests are the Forwarder group: the relay's subtests, each in the file of its subject
// (forwarder_crash.go, forwarder_order.go, …); this file holds what they share.
func forwarderTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"CrashAfterCommitBeforePublish", crashAfterCommitBeforePublish[TTx]},
		{"MessageCarriesIdentityAndOrigin", messageCarriesIdentityAndOrigin[TTx]},
		{"FailureBacksOffThenSucceeds", failureBacksOffThenSucceeds[TTx]},
		{"DeadLetterThenReplay", deadLetterThenReplay[TTx]},
		{"CrashAfterPublishBeforeMark", crashAfterPublishBeforeMark[TTx]},
		{"TwoForwardersAtOnce", twoForwardersAtOnce[TTx]},
		{"PerKeyOrderWithRandomFailures", perKeyOrderWithRandomFailures[TTx]},
		{"FailingKeyDoesNotHoldUpOthers", failingKeyDoesNotHoldUpOthers[TTx]},
		{"ParkKeyOnDeadLetter", parkKeyOnDeadLetter[TTx]},
		{"ReplayedHeadWaitsForNothingButBackingOffRowsStillBlock", replayedHeadWaitsForNothing[TTx]},
		{"BrokerOutageOpensCircuitWithoutBurningAttempts", brokerOutage[TTx]},
		{"MalformedRowIsDeadLetteredNotBlocking", malformedRow[TTx]},
		{"PrunePublished", prunePublished[TTx]},
		{"DeleteOnPublish", deleteOnPublish[TTx]},
		{"Stats", outboxStats[TTx]},
		{"StuckKeyWithLongBacklogDoesNotStarveOthers", stuckKeyDoesNotStarve[TTx]},
		{"RowHeldElsewhereHoldsBackTheRestOfItsKey", rowHeldElsewhere[TTx]},
		{"DeadLetterListingAndFilters", deadLetterListing[TTx]},
		{"PermanentFailureDeadLettersAtOnce", permanentFailureDeadLettersAtOnce[TTx]},
		{"AccessDeniedHoldsAndRefusesToStart", accessDeniedHoldsAndRefusesToStart[TTx]},
		{"RunRefusesUnmigratedTables", runRefusesUnmigratedTables[TTx]},
		{"TransactionalCrashAfterCommitBeforeMark", txnCrashAfterCommitBeforeMark[TTx]},
		{"TransactionalRefusesAnotherOutboxsProgress", txnRefusesAnotherOutboxsProgress[TTx]},
	}
}

var errBroken = errors.New("broker refused the message: schema mismatch")

// write commits events to the outbox, each key's events in order, many per transaction.
func write[TTx any](t testing.TB, e *Env[TTx], keys []string, perKey int) []*message.Message {
	t.Helper()
	var all []*message.Message
	for i := 0; i < perKey; i++ {
		for _, k := range keys {
			all = append(all, pipeline.NewEvent("Happened", k, []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, k, i))))
		}
	}
	for start := 0; start < len(all); start += 500 {
		end := min(start+500, len(all))
		if err := e.InTx(context.Background(), func(tx TTx) error {
			pub, err := pipeline.NewPublisher(e.Store, tx, pipeline.PublisherConfig{})
			if err != nil {
				return err
			}
			return pub.Publish("events", all[start:end]...)
		}); err != nil {
			t.Fatal(err)
		}
	}
	return all
}

// newForwarder builds a forwarder over s with a fake clock and no jitter.
func newForwarder(t testing.TB, s store.Store, pub message.Publisher, clk *clock, tune ...func(*forwarder.Config)) *forwarder.Forwarder {
	t.Helper()
	cfg := forwarder.Config{
		Store:          s,
		Publisher:      pub,
		Now:            clk.Now,
		Backoff:        forwarder.Backoff{Initial: time.Second, Max: time.Minute, Multiplier: 2},
		CircuitBackoff: forwarder.Backoff{Initial: time.Second, Max: 10 * time.Second, Multiplier: 2},
	}
	for _, fn := range tune {
		fn(&cfg)
	}
	f, err := forwarder.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func dispatch(t testing.TB, f *forwarder.Forwarder) forwarder.Result {
	t.Helper()
	res, err := f.DispatchBatch(context.Background())
	if err != nil {
		t.Fatalf("DispatchBatch: %v", err)
	}
	return res
}

// drain runs passes, moving the clock past any backoff, until a pass claims nothing.
func drain(t testing.TB, f *forwarder.Forwarder, clk *clock) {
	t.Helper()
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("outbox did not drain")
		}
		res := dispatch(t, f)
		if res.Claimed == 0 && !res.CircuitOpen {
			return
		}
		clk.Advance(time.Minute)
	}
}

// assertPerKeyOrder checks that each key's accepted messages came in increasing seq order.
func assertPerKeyOrder(t *testing.T, accepted []sent) {
	t.Helper()
	last := map[string]int64{}
	for _, s := range accepted {
		seq, err := strconv.ParseInt(s.seq, 10, 64)
		if err != nil {
			t.Fatalf("message %s has no seq stamp", s.uuid)
		}
		if seq <= last[s.key] {
			t.Fatalf("key %s: seq %d published after seq %d", s.key, seq, last[s.key])
		}
		last[s.key] = seq
	}
}

func keysN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%02d", i)
	}
	return out
}

const pending = `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`
