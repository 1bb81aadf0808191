package integration

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// Kafka consumer groups are balanced cooperatively: when a member joins (or leaves, or a restarted
// one comes back as a new member), only the partitions that move are revoked. The members already
// there keep the others without a pause — with eager rebalancing (Sarama's) every member gives up
// every partition at each rebalance, and the whole group stops while it is balanced again. The
// partition that moves is committed before it does, so its new owner reads only first deliveries.
func TestKafka_MemberJoiningRevokesOnlyThePartitionsThatMove(t *testing.T) {
	t.Parallel()
	url := testenv.KafkaURL(t)
	topic := testenv.UniqueName(t, "coop")
	group := testenv.UniqueName(t, "g")
	createKafkaTopic(t, url, topic, 4)
	producer := openBackend(t, url, backends.Options{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	publishing := publishSteadily(ctx, producer.Publisher, topic, 40, 5*time.Millisecond) // over every partition
	defer func() { cancel(); <-publishing }()

	type member struct {
		log         *watermill.CaptureLoggerAdapter
		got         atomic.Int64
		redelivered atomic.Int64 // or not known to be first deliveries
		stop        func()
	}
	join := func() *member {
		m := &member{log: watermill.NewCaptureLogger()}
		t.Cleanup(func() {
			if t.Failed() {
				for level, msgs := range m.log.Captured() {
					for _, c := range msgs {
						if level >= watermill.InfoLogLevel {
							t.Logf("member log: %s %v %v", c.Msg, c.Fields, c.Err)
						}
					}
				}
			}
		})
		b := openBackend(t, url, backends.Options{Logger: m.log})
		sub, err := b.NewSubscriber(group)
		if err != nil {
			t.Fatal(err)
		}
		mctx, mcancel := context.WithCancel(ctx)
		msgs, err := sub.Subscribe(mctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for msg := range msgs {
				m.got.Add(1)
				if again, known := outboxkit.Redelivered(msg.Context()); again || !known {
					m.redelivered.Add(1)
				}
				msg.Ack()
			}
		}()
		m.stop = func() { mcancel(); _ = sub.Close(); <-done }
		return m
	}
	a, b := join(), join()
	defer a.stop()
	defer b.stop()
	testenv.Eventually(t, 60*time.Second, "both members to own two partitions each and get messages", func() bool {
		return len(owned(a.log, -1)) == 2 && len(owned(b.log, -1)) == 2 && a.got.Load() > 20 && b.got.Load() > 20
	})
	markA, markB := len(a.log.Captured()[watermill.InfoLogLevel]), len(b.log.Captured()[watermill.InfoLogLevel])

	c := join()
	defer c.stop()
	testenv.Eventually(t, 60*time.Second, "the new member to be assigned a partition and get messages", func() bool {
		return len(owned(c.log, -1)) == 1 && c.got.Load() > 20 && len(owned(a.log, -1))+len(owned(b.log, -1)) == 3
	})
	for name, m := range map[string]struct {
		log  *watermill.CaptureLoggerAdapter
		mark int
	}{"first": {a.log, markA}, "second": {b.log, markB}} {
		before, after := owned(m.log, m.mark), owned(m.log, -1)
		var revoked []int32
		for _, e := range partitionChanges(m.log)[m.mark:] {
			if e.change == "Kafka partitions revoked" {
				revoked = append(revoked, e.partitions...)
			}
		}
		for _, p := range revoked {
			if slices.Contains(after, p) {
				t.Errorf("the %s member owned %v, owns %v, and had partition %d revoked though it kept it: the group stopped it while rebalancing",
					name, before, after, p)
			}
		}
	}
	// The partition that moved was committed before it did: what its new owner reads was never
	// handed out before.
	if n := c.redelivered.Load(); n > 0 {
		t.Errorf("the new member got %d messages that may have been delivered before: the partition moved uncommitted", n)
	}
	fromA, fromB := a.got.Load(), b.got.Load()
	testenv.Eventually(t, 30*time.Second, "the members already there to go on", func() bool {
		return a.got.Load() > fromA+20 && b.got.Load() > fromB+20
	})
}

type partitionChange struct {
	change     string
	partitions []int32
}

// partitionChanges lists the assignments and revocations a member logged, in order (mark: the
// number of info lines logged at some point; -1: all).
func partitionChanges(l *watermill.CaptureLoggerAdapter) []partitionChange {
	var changes []partitionChange
	for _, m := range l.Captured()[watermill.InfoLogLevel] {
		pc := partitionChange{change: m.Msg}
		if m.Msg != "Kafka partitions assigned" && m.Msg != "Kafka partitions revoked" {
			pc.change = ""
		}
		if pc.change != "" {
			for _, f := range strings.Fields(strings.Trim(fmt.Sprint(m.Fields["partitions"]), "[]")) {
				p, _ := strconv.Atoi(f)
				pc.partitions = append(pc.partitions, int32(p))
			}
		}
		changes = append(changes, pc)
	}
	return changes
}

// owned is what a member owned after its first mark info lines (-1: now).
func owned(l *watermill.CaptureLoggerAdapter, mark int) []int32 {
	changes := partitionChanges(l)
	if mark >= 0 {
		changes = changes[:mark]
	}
	var own []int32
	for _, c := range changes {
		switch c.change {
		case "Kafka partitions assigned":
			own = append(own, c.partitions...)
		case "Kafka partitions revoked":
			own = slices.DeleteFunc(own, func(p int32) bool { return slices.Contains(c.partitions, p) })
		}
	}
	slices.Sort(own)
	return own
}
