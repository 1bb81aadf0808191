package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// newSchema migrates outboxkit's tables into a fresh schema named prefix_<unique> and returns
// it with the function that drops it again.
func newSchema(ctx context.Context, pool *pgxpool.Pool, prefix string) (schema string, drop func(), err error) {
	schema = fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()%1e9)
	if _, err := pipeline.Migrate(ctx, storeIn(pool, schema, pgxstore.Config{})); err != nil {
		return "", nil, err
	}
	return schema, func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }, nil
}

// started waits for a component's Running channel, for at most 30s.
func started(running <-chan struct{}, what string) error {
	select {
	case <-running:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s did not start within 30s", what)
	}
}

// storeIn is outboxkit's store in schema on pool. The bench's schema names are valid, so an error
// here is a bug.
func storeIn(pool *pgxpool.Pool, schema string, cfg pgxstore.Config) *pgxstore.Store {
	cfg.Schema = schema
	s, err := pgxstore.New(pool, cfg)
	if err != nil {
		panic(err)
	}
	return s
}

// cpuProfile is --cpuprofile's file, which receives one CPU profile: of the measurement a
// scenario picks. Its methods do nothing when no profile was asked for.
type cpuProfile struct{ f *os.File }

func openProfile(path string) (*cpuProfile, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &cpuProfile{f: f}, nil
}

func (p *cpuProfile) close() {
	if p != nil {
		_ = p.f.Close()
	}
}

// during runs fn, profiled when on.
func (p *cpuProfile) during(on bool, fn func() error) error {
	if p == nil || !on {
		return fn()
	}
	if err := pprof.StartCPUProfile(p.f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return fn()
}
