package pg_test

import (
	"context"
	"testing"

	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store/internal/pg"
)

// The console's indexes (0012) built CONCURRENTLY, outside a transaction, as on a large outbox;
// a migration cut short (its version row missing, an index gone) runs again whole.
func TestNoTransactionMigrationBuildsConcurrently(t *testing.T) {
	before := pg.ConcurrentAbove
	pg.ConcurrentAbove = 0 // every outbox is "large": the CONCURRENTLY path
	t.Cleanup(func() { pg.ConcurrentAbove = before })
	p := testenv.NewPG(t)
	ctx := context.Background()
	valid := func() int {
		var n int
		if err := p.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND i.indisvalid
AND c.relname IN ('outbox_dead_waiting_idx', 'outbox_dead_group_idx', 'dead_letters_console_time_idx')`, string(p.Schema)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := valid(); n != 3 {
		t.Fatalf("%d of 3 console indexes valid after the migration", n)
	}
	p.Exec(t, `DROP INDEX {{schema}}.outbox_dead_group_idx`)
	p.Exec(t, `DELETE FROM {{schema}}.schema_migrations WHERE version = 12`)
	res, err := p.Store.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) != 1 || res.Applied[0] != 12 || valid() != 3 {
		t.Fatalf("migrated again: applied %v, %d of 3 indexes valid", res.Applied, valid())
	}
}
