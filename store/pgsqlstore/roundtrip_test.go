package pgsqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
)

// The outbox row costs a database/sql transaction the round trips of the caller's own INSERT of a
// row on the same driver, counted on the wire: one through pgx's driver, which keeps the prepared
// statement; two through lib/pq, which describes every statement with arguments before binding
// it. Anything more (a prepare because the INSERT's text changed, a look-up before it) would be
// pure latency at one client. The connection's statements are prepared by a first transaction.
func TestPublishCostsWhatARowCosts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		driver string
		row    int // round trips of an INSERT with arguments
	}{{"pgx", 1}, {"postgres", 2}} {
		t.Run(c.driver, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pg := testenv.NewPG(t)
			pg.Exec(t, `CREATE TABLE `+pg.Schema.Ident()+`.orders (id text PRIMARY KEY, total_cents bigint NOT NULL)`)
			pg.Exec(t, `CREATE TABLE `+pg.Schema.Ident()+`.events_min (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload text NOT NULL)`)
			rt := &testenv.RoundTrips{}
			var db *sql.DB
			switch c.driver {
			case "pgx":
				cfg, err := pgx.ParseConfig(pg.URL)
				if err != nil {
					t.Fatal(err)
				}
				cfg.DialFunc = rt.Dial
				// The driver pings a connection that was idle for a second before handing it out
				// again (the first time too): a round trip of the pool's, not of the transaction's.
				db = stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false }))
			default:
				conn, err := pq.NewConnector(pg.URL)
				if err != nil {
					t.Fatal(err)
				}
				conn.Dialer(rt.Dialer())
				db = sql.OpenDB(conn)
			}
			db.SetMaxOpenConns(1) // every transaction on the one connection the first one warmed
			t.Cleanup(func() { _ = db.Close() })
			s, err := pgsqlstore.New(db, pgsqlstore.Config{Schema: string(pg.Schema)})
			if err != nil {
				t.Fatal(err)
			}

			n := 0
			in := func(then func(*sql.Tx) error) func() error {
				return func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					n++
					if _, err := tx.ExecContext(ctx, `INSERT INTO `+pg.Schema.Ident()+`.orders (id, total_cents) VALUES ($1, $2)`,
						fmt.Sprintf("o-%d", n), n); err != nil {
						return err
					}
					if err := then(tx); err != nil {
						return err
					}
					return tx.Commit()
				}
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
			base := count("the business transaction alone", in(func(*sql.Tx) error { return nil }))
			row := count("a second row", in(func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO `+pg.Schema.Ident()+`.events_min (payload) VALUES ($1)`, `{"n":1}`)
				return err
			})) - base
			if row != c.row {
				t.Fatalf("a second INSERT took %d round trips on %s; want %d (is the counter right?)", row, c.driver, c.row)
			}
			got := count("two Publish calls", in(func(tx *sql.Tx) error {
				pub, err := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
				if err != nil {
					return err
				}
				plain := message.NewMessage(fmt.Sprintf("order-%d-placed", n), []byte(`{"n":2}`))
				plain.Metadata.Set("source", `checkout "web" <v2>`)
				for _, ev := range []*message.Message{pipeline.NewEvent("OrderPlaced", "o-1", []byte(`{"n":1}`)), plain} {
					if err := pub.Publish("orders", ev); err != nil {
						return err
					}
				}
				return nil
			})) - base
			if got != 2*row {
				t.Fatalf("two Publish calls, one event each, cost the transaction %d round trips on %s; want %d, what two rows cost", got, c.driver, 2*row)
			}
		})
	}
}
