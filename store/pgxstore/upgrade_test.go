package pgxstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/pg"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// An outbox written by version 5 (text ids, jsonb metadata, four indexes at insert) upgrades in
// place: its backlog and dead letters move to the new table with their seq and their ids (a
// non-UUID id and a non-canonical UUID keep their exact text), the relay publishes the backlog in
// order, the old ids still refuse a second write, new rows come after the old ones, and the
// published history stays in outbox_v5.
func TestUpgradeFromVersion5KeepsBacklogOrderAndIds(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyPG(t)
	ctx := context.Background()
	db.Exec(t, `CREATE SCHEMA {{schema}}`)
	db.Exec(t, `CREATE TABLE {{schema}}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`)
	for _, m := range pg.Migrations() {
		if m.Version > 5 {
			break
		}
		db.Exec(t, m.SQL)
		db.Exec(t, `INSERT INTO {{schema}}.schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
	}
	const (
		canonical = "0191e3a0-7c1d-7b2e-9f00-000000000001"
		textID    = "order-42/placed"
		upperID   = "0191E3A0-7C1D-7B2E-9F00-000000000003"
		deadID    = "0191e3a0-7c1d-7b2e-9f00-000000000004"
		oldID     = "0191e3a0-7c1d-7b2e-9f00-000000000005"
	)
	db.Exec(t, `INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata, published_at)
		VALUES ($1, 'events', 'k', '\x01', '{"name": "Old"}', now())`, oldID)
	for _, id := range []string{canonical, textID, upperID} {
		db.Exec(t, `INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata)
			VALUES ($1, 'events', 'k', '\x02', '{"name": "Pending"}')`, id)
	}
	db.Exec(t, `INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata, attempts, dead_lettered_at, last_error)
		VALUES ($1, 'events', 'other', '\x03', '{}', 10, now(), 'refused')`, deadID)
	maxOld := db.Int(t, `SELECT max(seq) FROM {{schema}}.outbox`)

	res, err := db.Store.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) < 1 || res.Applied[0] != 6 {
		t.Fatalf("applied %v, want 6 first", res.Applied)
	}
	if n := db.Int(t, `SELECT count(*) FROM {{schema}}.outbox_v5`); n != 1 {
		t.Fatalf("outbox_v5 holds %d rows, want the 1 published", n)
	}
	if n := db.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`); n != 1 {
		t.Fatalf("%d dead letters after the upgrade, want 1", n)
	}

	// The same ids are still refused.
	for _, id := range []string{canonical, textID, upperID, deadID} {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := pipeline.NewPublisher(db.Store, tx, pipeline.PublisherConfig{})
		err = pub.Publish("events", message.NewMessage(id, []byte("again")))
		_ = tx.Rollback(ctx)
		if !errors.Is(err, store.ErrDuplicateUUID) {
			t.Fatalf("writing %s again after the upgrade: %v, want ErrDuplicateUUID", id, err)
		}
	}
	fresh := publish(t, db, db.Store, "k", 1)[0]
	if seq := db.Int(t, `SELECT seq FROM {{schema}}.outbox WHERE uuid = $1::uuid`, fresh.UUID); seq <= maxOld {
		t.Fatalf("a new row got seq %d, not after the old rows' %d", seq, maxOld)
	}

	rec := recorder{sent: make(chan string, 10)}
	f, err := forwarder.New(forwarder.Config{Store: db.Store, Publisher: rec, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunForwarder(t, f)
	for _, want := range []string{canonical, textID, upperID, fresh.UUID} {
		expectPublished(t, rec, want, 15*time.Second, "the upgraded backlog was not relayed in order")
	}
}
