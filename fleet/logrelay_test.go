package fleet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
)

// Outboxes relayed from Postgres's write-ahead log (forwarder/pglog through fleetstores): each
// owner reads its outboxes' replication slots, and a member that leaves hands them to another,
// which takes the slot over where it was.
func TestMember_LogRelay(t *testing.T) {
	coord := testenv.NewLogicalPG(t)
	pub := newRecorder(t)
	var names []string
	outboxes := fleet.Outboxes{}
	writers := map[string]writer{}
	for i := range 2 {
		pg := testenv.NewLogicalPG(t)
		t.Cleanup(func() { dropSlots(t, pg) }) // once the members have stopped
		name := fmt.Sprintf("log-%d", i)
		w, err := pgsqlstore.New(pg.DB, pgsqlstore.Config{Schema: string(pg.Schema)})
		if err != nil {
			t.Fatal(err)
		}
		outboxes = append(outboxes, fleet.Outbox{Name: name, URL: pg.URL, Schema: string(pg.Schema), Relay: fleet.RelayLog})
		writers[name], names = writer{st: w, db: pg.DB}, append(names, name)
	}
	cfg := func(member string) fleet.Config {
		return timing(fleet.Config{Fleet: "log", Member: member, Coordination: coord.Store, Catalog: outboxes, Publisher: pub})
	}
	m1, m2 := start(t, cfg("m1")), start(t, cfg("m2"))
	waitSpread(t, names, 1, m1, m2)
	var ids []string
	for _, n := range names {
		ids = append(ids, writers[n].write(t, 5)...)
	}
	waitReceived(t, pub, ids, 20*time.Second)

	if err := m1.stop(); err != nil {
		t.Fatal(err)
	}
	waitOwnedOnce(t, names, m2)
	for _, n := range names {
		ids = append(ids, writers[n].write(t, 5)...)
	}
	waitReceived(t, pub, ids, 20*time.Second)
	pub.checkFencing(t)
}

// dropSlots drops the replication slots and publications the log relays made for pg's schema.
func dropSlots(t *testing.T, pg *testenv.PG) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := "outboxkit_" + string(pg.Schema) + "%"
	if _, err := pg.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE $1`, prefix); err != nil {
		t.Errorf("drop the slots of %s: %v", pg.Schema, err)
	}
	rows, err := pg.Pool.Query(ctx, `SELECT pubname FROM pg_publication WHERE pubname LIKE $1`, prefix)
	if err != nil {
		t.Errorf("list the publications of %s: %v", pg.Schema, err)
		return
	}
	var pubs []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err == nil {
			pubs = append(pubs, p)
		}
	}
	rows.Close()
	for _, p := range pubs {
		if _, err := pg.Pool.Exec(ctx, `DROP PUBLICATION IF EXISTS "`+p+`"`); err != nil {
			t.Errorf("drop publication %s: %v", p, err)
		}
	}
}
