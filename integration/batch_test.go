package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
)

// Failure matrix, batched: the consumer process dies inside a batch, after some of its handlers
// ran and before the commit. Nothing of the batch is left; the restarted consumer applies every
// message once, counting the redelivered ones.
func TestBatch_CrashMidBatchLeavesNothingAndEveryMessageIsAppliedOnce(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	db := pgDB(pg)
	createEffects(t, db)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "batch")
	testenv.DeclareQueue(t, url, topic, "billing")
	ids := append(append(goods(10), "crash"), goods(20)[10:]...)
	msgs := publishShipments(t, url, topic, ids...)
	crash := msgs[10].UUID

	handled := filepath.Join(t.TempDir(), "handled")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBatchConsumer$", "-test.v")
	cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_BATCH="+strings.Join([]string{pg.URL, string(pg.Schema), url, topic, crash, handled}, "|"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Fatalf("the consumer process did not die in the batch (%v):\n%s", err, out)
	}
	raw, _ := os.ReadFile(handled)
	if ran := strings.Count(string(raw), "\n"); ran < 5 {
		t.Fatalf("%d handlers ran in the batch before the crash; the test needs the crash mid-batch:\n%s", ran, out)
	}
	if n := countEffects(t, db, "billing"); n != 0 {
		t.Fatalf("%d effects of the crashed batch survived: a batch commits whole or not at all", n)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox`); n != 0 {
		t.Fatalf("%d inbox rows of the crashed batch survived", n)
	}

	// The restarted consumer.
	b := openBackend(t, url, backends.Options{Unacked: 50})
	startEffectConsumer(t, context.Background(), db, b, topic, "billing", withBatch(50))
	testenv.Eventually(t, 60*time.Second, "every message to be applied after the restart", func() bool {
		return countEffects(t, db, "billing") >= len(msgs)
	})
	if n := countEffects(t, db, "billing"); n != len(msgs) {
		t.Fatalf("%d effects, want exactly %d", n, len(msgs))
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE deliveries = 2`); n < 11 {
		t.Fatalf("%d redelivered messages counted as second deliveries, want at least the 11 the crash held", n)
	}
}

// TestHelperBatchConsumer is the consumer process of TestBatch_CrashMidBatch…: a batch consumer
// that lingers so the whole queue is one batch, notes each message its handler runs for, and exits
// with status 7 in the handler of the message the test names.
func TestHelperBatchConsumer(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_BATCH")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	pgURL, schemaName, amqpURL, topic, crash, handled := p[0], p[1], p[2], p[3], p[4], p[5]
	pg := testenv.AttachPG(t, pgURL, schemaName)
	sub, err := amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: amqpURL, Consumer: "billing", Unacked: 50})
	if err != nil {
		t.Fatal(err)
	}
	notes, err := os.OpenFile(handled, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	effect := pgDB(pg).Effect(func(_ context.Context, m *message.Message) (string, []any) {
		if m.UUID == crash {
			os.Exit(7) // the process dies mid-batch, its transaction open
		}
		_, _ = notes.WriteString(m.UUID + "\n")
		return `INSERT INTO {{schema}}.effects (consumer, message_id, pkey, seq) VALUES (?, ?, ?, 0)`, []any{"billing", m.UUID, m.UUID}
	})
	bc, err := middleware.NewBatchConsumer(middleware.BatchConfig{
		StackConfig: middleware.StackConfig{Store: pg.Store, Consumer: "billing", MaxRetries: -1},
		MaxBatch:    50, Linger: 2 * time.Second,
	}, sub, topic, middleware.NoPublish(effect))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_ = bc.Run(ctx)
	t.Fatal("the consumer ran out of time without reaching the message that kills it")
}

// Failure matrix, batched: a message no handler can decode arrives in the middle of a batch through
// RabbitMQ. It is dead-lettered alone, on its first delivery; the rest of the batch commits.
func TestBatch_PoisonInABatchIsDeadLetteredAloneOnItsFirstDelivery(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	db := pgDB(pg)
	createEffects(t, db)
	url := testenv.AMQPURL(t)
	topic := testenv.UniqueName(t, "batch")
	testenv.DeclareQueue(t, url, topic, "billing")
	msgs := publishShipments(t, url, topic, append(append(goods(10), "not json"), goods(20)[10:]...)...)
	b := openBackend(t, url, backends.Options{Unacked: 50})
	startEffectConsumer(t, context.Background(), db, b, topic, "billing", withBatch(50))
	testenv.Eventually(t, 60*time.Second, "the good messages to be applied and the poison dead-lettered", func() bool {
		return countEffects(t, db, "billing") >= len(msgs)-1 && pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters`) >= 1
	})
	if n := countEffects(t, db, "billing"); n != len(msgs)-1 {
		t.Fatalf("%d effects, want %d", n, len(msgs)-1)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE message_id = $1 AND deliveries = 1`, msgs[10].UUID); n != 1 {
		t.Fatalf("the poison was not dead-lettered alone on its first delivery (%d rows)", n)
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters`); n != 1 {
		t.Fatalf("%d dead letters, want the poison alone", n)
	}
}
