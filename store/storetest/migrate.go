package storetest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
)

func migrateTests[TTx any]() []test[TTx] {
	return []test[TTx]{
		{"Idempotent", migrateIdempotent[TTx]},
		{"RefusesNewerDatabase", migrateRefusesNewer[TTx]},
		{"SeveralProcessesAtOnce", migrateFromProcesses[TTx]},
	}
}

func migrateIdempotent[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := h.Open(t)
	ctx := context.Background()
	first, err := pipeline.Migrate(ctx, e.Store)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Applied) == 0 || first.Version != first.Applied[len(first.Applied)-1] {
		t.Fatalf("first run = %+v, want every migration applied", first)
	}
	second, err := pipeline.Migrate(ctx, e.Store)
	if err != nil || len(second.Applied) != 0 || second.Version != first.Version {
		t.Fatalf("second run = %+v, %v; want nothing applied", second, err)
	}
}

func migrateRefusesNewer[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	e.MustExec(t, `INSERT INTO {{schema}}.schema_migrations (version, name, applied_at) VALUES (9999, 'future', ?)`, "2030-01-01 00:00:00")
	if _, err := pipeline.Migrate(context.Background(), e.Store); !errors.Is(err, store.ErrNewerSchema) {
		t.Fatalf("got %v, want store.ErrNewerSchema", err)
	}
}

// Several processes migrate one database at once: each migration is applied exactly once.
func migrateFromProcesses[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	if h.ProcessURL == nil {
		t.Skipf("%s: no URL reaches the store from another process", h.Name)
	}
	for round := 0; round < 2; round++ {
		e := h.Open(t)
		url, ns := h.ProcessURL(t, e)
		var wg sync.WaitGroup
		outs := make([]string, 3)
		errs := make([]error, 3)
		for i := range outs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
				cmd.Env = append(os.Environ(), helperEnv+"=migrate|"+url+"|"+ns)
				out, err := cmd.CombinedOutput()
				outs[i], errs[i] = string(out), err
			}()
		}
		wg.Wait()
		applied := 0
		for i, err := range errs {
			if err != nil {
				t.Fatalf("process %d: %v\n%s", i, err, outs[i])
			}
			applied += strings.Count(outs[i], "APPLIED ")
		}
		res, err := pipeline.Migrate(context.Background(), e.Store)
		if err != nil || len(res.Applied) != 0 {
			t.Fatalf("after the processes: %+v, %v", res, err)
		}
		if migrations := e.MustInt(t, `SELECT count(*) FROM {{schema}}.schema_migrations`); applied != migrations {
			t.Fatalf("round %d: the processes applied %d migrations in all, the database has %d: each must be applied exactly once",
				round, applied, migrations)
		}
	}
}

func runHelper(t *testing.T, spec string) {
	parts := strings.Split(spec, "|")
	if parts[0] != "migrate" || len(parts) != 3 {
		t.Fatalf("helper: unknown task %q", spec)
	}
	ctx := context.Background()
	db, err := store.Open(ctx, parts[1], store.OpenOptions{Schema: parts[2], PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := pipeline.Migrate(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Applied {
		os.Stdout.WriteString("APPLIED " + string(rune('0'+v%10)) + "\n")
	}
}
