package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outboxkit/handlers"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

// On every backend: a message is dead-lettered, an operator replays it at once, and the handler
// runs again. A broker that deduplicates on the message id (JetStream's Nats-Msg-Id within its
// DuplicateWindow) must not swallow the replay while the replay reports success; the inbox still
// deduplicates on the message's UUID.
func TestReplay_ArrivesOnEveryBackendRightAfterItIsDeadLettered(t *testing.T) {
	for _, bc := range backendCases {
		t.Run(bc.scheme, func(t *testing.T) {
			t.Parallel()
			pg := testenv.NewPG(t)
			url := bc.url(t)
			b := openBackend(t, url, bc.opts)
			topic := testenv.UniqueName(t, "replay") + ".placed"
			dropWhenDone(t, bc.scheme, url, []string{topic}, []string{"billing"})
			if bc.scheme == "amqp" {
				testenv.DeclareQueue(t, url, topic, "billing")
			}
			pg.Exec(t, `CREATE TABLE {{schema}}.effects (message_id text PRIMARY KEY)`)

			var (
				mu   sync.Mutex
				runs = map[string]int{}
			)
			sub, err := b.NewSubscriber("billing")
			if err != nil {
				t.Fatal(err)
			}
			stack, err := middleware.Stack(middleware.StackConfig{Store: pg.Store, Consumer: "billing", MaxRetries: -1})
			if err != nil {
				t.Fatal(err)
			}
			router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			effects := pg.Schema.Ident() + ".effects"
			h := router.AddConsumerHandler("billing", topic, sub, func(msg *message.Message) error {
				mu.Lock()
				runs[msg.UUID]++
				first := runs[msg.UUID] == 1
				mu.Unlock()
				if first {
					return handlers.Permanent(errors.New("customer has no billing account yet"))
				}
				return handlers.JSON(func(ctx context.Context, tx pgx.Tx, _ map[string]any) error {
					_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (message_id) VALUES ($1)`, msg.UUID)
					return err
				})(msg)
			})
			h.AddMiddleware(stack...)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- router.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("router: %v", err)
				}
				_ = sub.Close()
			})
			select {
			case <-router.Running():
			case <-time.After(60 * time.Second):
				t.Fatal("consumer did not start")
			}

			msg := pipeline.NewEvent("OrderPlaced", "order-1", []byte(`{"id":"order-1"}`))
			if err := b.Publisher.Publish(topic, msg); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 60*time.Second, "the message to be dead-lettered", func() bool {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.dead_letters WHERE message_id = $1`, msg.UUID) == 1
			})
			replayed, err := middleware.ReplayInboxDeadLetters(context.Background(),
				middleware.ReplayConfig{Store: pg.Store, Publisher: b.Publisher},
				store.DeadLetterFilter{MessageIDs: []string{msg.UUID}})
			if err != nil || len(replayed) != 1 {
				t.Fatalf("replay = %d letters, %v", len(replayed), err)
			}
			testenv.Eventually(t, 30*time.Second, "the replayed message to be handled", func() bool {
				return pg.Int(t, `SELECT count(*) FROM {{schema}}.effects WHERE message_id = $1`, msg.UUID) == 1
			})
			mu.Lock()
			defer mu.Unlock()
			if runs[msg.UUID] != 2 {
				t.Fatalf("the handler ran %d times, want twice (the dead-lettered delivery and the replay)", runs[msg.UUID])
			}
		})
	}
}
