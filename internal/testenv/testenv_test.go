package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The log relay's server is one where logical replication works: its tests would fail for the
// wrong reason otherwise.
func TestPGLogicalServerHasLogicalWAL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, PGLogicalURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("%s serves wal_level = %s, want logical: start scripts/pg-logical.sh and point %s at it", EnvPGLogical, level, EnvPGLogical)
	}
}
