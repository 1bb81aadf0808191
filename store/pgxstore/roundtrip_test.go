package pgxstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// The outbox row's price in round trips, counted on the wire: at one client each round trip is
// pure latency, so a second statement per Publish (a prepare because the INSERT's text changed, a
// look-up before it, a NOTIFY of its own) would cost the caller's transaction as much as the row
// itself. Publish costs one round trip, as the caller's own INSERT of a row does; Transact, none:
// the row goes with the COMMIT. Whether writers notify, and whether a relay is awake, changes
// what the INSERT does, not how many round trips it takes. The connection's statements are
// prepared by a first transaction of each kind, as on any connection in use.
func TestPublishCostsOneRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		cfg   pgxstore.Config
		awake bool
	}{
		{"notify", pgxstore.Config{}, false},
		{"notify, a relay awake", pgxstore.Config{}, true},
		{"DisableNotify", pgxstore.Config{DisableNotify: true}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pg := testenv.NewPG(t)
			pg.Exec(t, `CREATE TABLE `+pg.Schema.Ident()+`.orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`)
			if c.awake {
				if err := pg.Store.Waker().(store.Awaker).Awake(ctx, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			rt := &testenv.RoundTrips{}
			pcfg, err := pgxpool.ParseConfig(pg.URL)
			if err != nil {
				t.Fatal(err)
			}
			pcfg.MaxConns = 1 // every transaction on the one connection the first one warmed
			pcfg.ConnConfig.DialFunc = rt.Dial
			pool, err := pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			c.cfg.Schema = string(pg.Schema)
			c.cfg.PollOnly = true // no LISTEN connection: only the writers' round trips are counted
			s, err := pgxstore.New(pool, c.cfg)
			if err != nil {
				t.Fatal(err)
			}

			n := 0
			order := func(tx pgx.Tx) error {
				n++
				_, err := tx.Exec(ctx, `INSERT INTO `+pg.Schema.Ident()+`.orders (id, total_cents) VALUES ($1, $2)`, fmt.Sprintf("o-%d", n), n)
				return err
			}
			// Events of every shape: the INSERT's text must not depend on what they hold.
			events := func() []*message.Message {
				plain := message.NewMessage(fmt.Sprintf("order-%d-placed", n), []byte(`{"n":2}`))
				plain.Metadata.Set("source", `checkout "web" <v2>`)
				return []*message.Message{pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{"n":1}`)), plain, message.NewMessage(pipeline.NewEvent("", "", nil).UUID, nil)}
			}
			alone := func() error { return pgx.BeginFunc(ctx, pool, order) }
			publishing := func() error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := order(tx); err != nil {
						return err
					}
					pub, err := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
					if err != nil {
						return err
					}
					for _, ev := range events() {
						if err := pub.Publish("orders", ev); err != nil {
							return err
						}
					}
					return nil
				})
			}
			transact := func() error {
				return s.Transact(ctx, pgx.TxOptions{}, func(tx pgx.Tx, pub *pipeline.Publisher) error {
					if err := order(tx); err != nil {
						return err
					}
					for _, ev := range events() {
						if err := pub.Publish("orders", ev); err != nil {
							return err
						}
					}
					return nil
				})
			}
			count := func(name string, tx func() error) int {
				t.Helper()
				if err := tx(); err != nil { // prepares the statements on the connection
					t.Fatalf("%s: %v", name, err)
				}
				_ = rt.Take()
				if err := tx(); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				return rt.Take()
			}
			base := count("the business transaction alone", alone)
			if base != 3 {
				t.Fatalf("BEGIN, INSERT, COMMIT took %d round trips; want 3 (is the counter right?)", base)
			}
			if got := count("three Publish calls", publishing) - base; got != 3 {
				t.Fatalf("three Publish calls, one event each, cost the transaction %d round trips; want 3, one INSERT each", got)
			}
			if got := count("Transact", transact) - base; got != 0 {
				t.Fatalf("Transact's three events cost the transaction %d round trips; want 0: the INSERT goes with the COMMIT", got)
			}
		})
	}
}
