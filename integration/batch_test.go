package integration

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

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
