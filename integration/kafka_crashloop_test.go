package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
)

// A Kafka consumer process that dies every few messages, as a handler that takes its process down
// does, still gets through the partition: what it acknowledged reaches the group's committed offset
// as it goes, not on a later tick, so its next process reads again only what the crash held, and
// no message is delivered over and over until it looks like the one that kills the process.
// Then the read horizon: a process that handed out a few records of a long backlog and died
// leaves its successor a few records to take for redeliveries, not hundreds.
func TestKafka_ConsumerCrashingEveryFewMessages(t *testing.T) {
	t.Parallel()
	url := testenv.KafkaURL(t)
	run := func(t *testing.T, pg *testenv.PG, topic, group string, every, total int) (exitCode int) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKafkaCrashEvery$", "-test.v")
		cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_KAFKA_CRASH="+strings.Join([]string{
			pg.URL, string(pg.Schema), url, topic, group, strconv.Itoa(every), strconv.Itoa(total)}, "|"))
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &exit) && exit.ExitCode() == 7:
			return 7
		}
		t.Fatalf("the consumer process failed (%v):\n%s", err, out)
		return -1
	}

	// setup gives a subtest its schema with the effects table, and a topic of one partition holding
	// messages events.
	setup := func(t *testing.T, messages int) (pg *testenv.PG, topic, group string, b *backends.Backend) {
		pg = testenv.NewPG(t)
		createEffects(t, pgDB(pg))
		topic = testenv.UniqueName(t, "crashloop") + ".placed"
		createKafkaTopic(t, url, topic, 1)
		b = openBackend(t, url, kafkaOpts)
		publishEvents(t, b, topic, goods(messages)...)
		return pg, topic, testenv.UniqueName(t, "billing"), b
	}

	t.Run("progress", func(t *testing.T) {
		t.Parallel()
		const (
			messages = 60
			every    = 10 // the process dies in the handler of its 10th message
			// Each process applies at least every-1 messages, less what its predecessor's crash
			// held (1, and the acknowledgements not yet committed): about 7 processes. Committing
			// on a one-second tick, a process that handled its messages within the tick committed
			// none of them, and its successor read them again: one message was counted 7 times.
			maxRounds = 12
		)
		pg, topic, group, _ := setup(t, messages)
		db := pgDB(pg)
		rounds := 0
		for {
			rounds++
			if rounds > maxRounds {
				t.Fatalf("%d consumer processes, each dying at its %dth message, applied %d of %d messages",
					maxRounds, every, countEffects(t, db, group), messages)
			}
			if run(t, pg, topic, group, every, messages) == 0 {
				break
			}
		}
		if n := countEffects(t, db, group); n != messages {
			t.Fatalf("%d effects, want exactly %d", n, messages)
		}
		// Typically 2 or 3: the message that killed a process, counted once more when a commit was
		// still in flight. At MaxDeliveries a message becomes a suspect of a crash loop and runs
		// alone in its process, holding back the others.
		most := pg.Int(t, `SELECT coalesce(max(deliveries), 0) FROM {{schema}}.inbox_deliveries`)
		t.Logf("%d messages in %d processes; at most %d deliveries counted for one", messages, rounds, most)
		if most >= middleware.DefaultMaxDeliveries {
			t.Fatalf("a message was counted %d times delivered (MaxDeliveries %d): processes read again what their predecessors had acknowledged",
				most, middleware.DefaultMaxDeliveries)
		}
	})

	t.Run("horizon", func(t *testing.T) {
		t.Parallel()
		const (
			messages = 400
			every    = 5
			// The dead process handed out 5 records; its successor counts those it may have
			// been handed (the fifth, and the horizon's stride past it, 16 at the start): a few
			// dozen at most. A horizon a fixed 256 records ahead made 256 of them suspects.
			maxCounted = 40
		)
		pg, topic, group, b := setup(t, messages)
		db := pgDB(pg)
		if code := run(t, pg, topic, group, every, messages); code != 7 {
			t.Fatalf("the first process did not die at its %dth message", every)
		}
		startEffectConsumer(t, context.Background(), db, b, topic, group)
		testenv.Eventually(t, 60*time.Second, "every message to be applied", func() bool {
			return countEffects(t, db, group) >= messages
		})
		counted := pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries`)
		t.Logf("after a process died at its %dth of %d records, %d delivery-count rows", every, messages, counted)
		if counted > maxCounted {
			t.Fatalf("%d delivery-count rows after a process died at its %dth record, want at most %d", counted, every, maxCounted)
		}
	})
}

// TestHelperKafkaCrashEvery is the consumer process of TestKafka_ConsumerCrashingEveryFewMessages:
// the full stack, exiting with status 7 in the handler of its every-th message, before the effect
// commits; with status 0 once every message is applied.
func TestHelperKafkaCrashEvery(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_KAFKA_CRASH")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	every, _ := strconv.Atoi(p[5])
	total, _ := strconv.Atoi(p[6])
	pg := testenv.AttachPG(t, p[0], p[1])
	db := pgDB(pg)
	b := openBackend(t, p[2], kafkaOpts)
	var handled atomic.Int64
	startEffectConsumer(t, context.Background(), db, b, p[3], p[4], withHook(func(*message.Message) {
		if handled.Add(1) == int64(every) {
			os.Exit(7)
		}
	}))
	testenv.Eventually(t, 60*time.Second, "every message to be applied", func() bool {
		return countEffects(t, db, p[4]) >= total
	})
}
