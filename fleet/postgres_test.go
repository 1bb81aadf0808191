package fleet_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store/pgsqlstore"
)

// A fleet on Postgres: the coordination database and six tenants, each a schema of one database
// (opened through one shared handle and one LISTEN connection per member), relayed by two members
// and then by the one left.
func TestMember_OnPostgres(t *testing.T) {
	coord := testenv.NewPG(t)
	app := testenv.UniqueName(t, "fleet") // names the members' sessions on the shared server
	pub := newRecorder(t)
	var names []string
	outboxes := fleet.Outboxes{}
	writers := map[string]writer{}
	for i := range 6 {
		pg := testenv.NewPG(t)
		name := fmt.Sprintf("tenant-%d", i)
		w, err := pgsqlstore.New(pg.DB, pgsqlstore.Config{Schema: string(pg.Schema)})
		if err != nil {
			t.Fatal(err)
		}
		url := pg.URL + "&application_name=" + app
		outboxes = append(outboxes, fleet.Outbox{Name: name, Tenant: "tenant-of-" + name, URL: url, Schema: string(pg.Schema)})
		writers[name], names = writer{st: w, db: pg.DB}, append(names, name)
	}
	cfg := func(member string) fleet.Config {
		return timing(fleet.Config{Fleet: "pg", Member: member, Coordination: coord.Store, Catalog: outboxes, Publisher: pub})
	}
	m1, m2 := start(t, cfg("m1")), start(t, cfg("m2"))
	waitSpread(t, names, 3, m1, m2)
	var ids []string
	for _, n := range names {
		ids = append(ids, writers[n].write(t, 5)...)
	}
	waitReceived(t, pub, ids, 10*time.Second)
	// Six schemas, two members: a LISTEN connection for each member, not for each schema.
	listening := func() int {
		return coord.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND (query ILIKE 'listen%' OR query ILIKE 'unlisten%')`, app)
	}
	if !testenv.Within(10*time.Second, func() bool { return listening() == 2 }) {
		t.Fatalf("%d LISTEN connections for 6 schemas and 2 members, want 2", listening())
	}
	t.Logf("6 schemas, 2 members: %d sessions in all", coord.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app))
	waitStatus(t, m2, "2 live members relaying 6 outboxes", func(st fleet.Status) bool {
		return st.LiveMembers() == 2 && len(st.Outboxes) == 6 && len(st.Unowned()) == 0
	})

	if err := m1.stop(); err != nil {
		t.Fatal(err)
	}
	waitOwnedOnce(t, names, m2)
	for _, n := range names {
		ids = append(ids, writers[n].write(t, 5)...)
	}
	waitReceived(t, pub, ids, 10*time.Second)
	pub.checkFencing(t)
}
