package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/outboxkit/internal/schema"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

func TestMigrate_Idempotent(t *testing.T) {
	t.Parallel()
	pg := testenv.NewEmptyPG(t)
	ctx := context.Background()
	first, err := pipeline.Migrate(ctx, pg.DB, string(pg.Schema))
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Applied) != len(schema.Migrations()) || first.Version != schema.Newest() {
		t.Fatalf("first run = %+v, want all %d migrations applied", first, len(schema.Migrations()))
	}
	second, err := pipeline.Migrate(ctx, pg.DB, string(pg.Schema))
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Applied) != 0 || second.Version != schema.Newest() {
		t.Fatalf("second run = %+v, want nothing applied", second)
	}
}

func TestMigrate_RejectsBadSchemaName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"Outbox", "1abc", "a-b", `x"; DROP TABLE y; --`, strings.Repeat("a", 51)} {
		_, err := pipeline.Migrate(context.Background(), nil, name)
		if err == nil || !strings.Contains(err.Error(), "lowercase letters") {
			t.Errorf("schema %q: got %v, want a message saying which names are usable", name, err)
		}
	}
}

func TestMigrate_RefusesNewerDatabase(t *testing.T) {
	t.Parallel()
	pg := testenv.NewPG(t)
	pg.Exec(t, `INSERT INTO {{schema}}.schema_migrations (version, name) VALUES (9999, 'future')`)
	_, err := pipeline.Migrate(context.Background(), pg.DB, string(pg.Schema))
	if err == nil || !strings.Contains(err.Error(), "upgrade outboxkit") {
		t.Fatalf("got %v, want an error asking to upgrade", err)
	}
}

// TestMigrate_TwoProcessesAtOnce runs Migrate in two separate processes started together.
func TestMigrate_TwoProcessesAtOnce(t *testing.T) {
	t.Parallel()
	for round := 0; round < 3; round++ {
		pg := testenv.NewEmptyPG(t)
		var wg sync.WaitGroup
		results := make([]pipeline.MigrateResult, 2)
		errs := make([]error, 2)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMigrateProcess$")
				cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_MIGRATE="+pg.URL+"|"+string(pg.Schema))
				out, err := cmd.CombinedOutput()
				if err != nil {
					errs[i] = fmt.Errorf("%v: %s", err, out)
					return
				}
				line := out[strings.Index(string(out), "RESULT ")+len("RESULT "):]
				line = line[:strings.IndexByte(string(line), '\n')]
				errs[i] = json.Unmarshal(line, &results[i])
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		total := len(results[0].Applied) + len(results[1].Applied)
		if total != len(schema.Migrations()) {
			t.Fatalf("round %d: processes applied %v and %v; want each migration applied exactly once",
				round, results[0].Applied, results[1].Applied)
		}
		if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.schema_migrations`); n != len(schema.Migrations()) {
			t.Fatalf("version rows = %d", n)
		}
	}
}

func TestHelperMigrateProcess(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_MIGRATE")
	if spec == "" {
		return // only meaningful as the subprocess of TestMigrate_TwoProcessesAtOnce
	}
	url, name, _ := strings.Cut(spec, "|")
	db := openDB(t, url)
	res, err := pipeline.Migrate(context.Background(), db, name)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(res)
	fmt.Printf("RESULT %s\n", out)
}
