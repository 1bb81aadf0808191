package pglog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outboxkit/store"
)

// SQLSTATEs the relay tells apart.
const (
	codeDuplicateObject = "42710" // CREATE PUBLICATION / CREATE_REPLICATION_SLOT: it exists
	codeObjectInUse     = "55006" // START_REPLICATION: another process reads the slot
	codeLimitExceeded   = "53400" // CREATE_REPLICATION_SLOT: no free slot
)

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func (r *Relay) ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func (r *Relay) table(name string) string { return pgx.Identifier{r.schema, name}.Sanitize() }

// checkServer refuses what no retry fixes, each with what to do about it.
func (r *Relay) checkServer(ctx context.Context) error {
	var (
		walLevel, role string
		version        int
		replication    bool
	)
	err := r.cfg.Pool.QueryRow(ctx, r.sql.ServerSettings).Scan(&walLevel, &version, &role, &replication)
	if err != nil {
		return fmt.Errorf("log relay %s: read the server's settings: %w", r.fcfg.Name, err)
	}
	if walLevel != "logical" {
		return fmt.Errorf("log relay %s: the server runs wal_level = %s, and reading the outbox from the log needs wal_level = logical: "+
			"set it (ALTER SYSTEM SET wal_level = logical) and restart the server; on a managed service set its parameter "+
			"(Amazon RDS and Aurora: rds.logical_replication = 1; Cloud SQL: cloudsql.logical_decoding = on; "+
			"Azure: azure.replication_support = logical) — or use the polling relay (forwarder.Run)", r.fcfg.Name, walLevel)
	}
	if version < 100000 {
		return fmt.Errorf("log relay %s: the server is Postgres %d.%d; the log relay needs 10 or newer (pgoutput)", r.fcfg.Name, version/10000, version%10000)
	}
	if r.cfg.Mode == ModeWAL && version < 140000 {
		return fmt.Errorf("log relay %s: the server is Postgres %d.%d, and WAL mode needs 14 or newer (pgoutput carries logical decoding messages from 14): "+
			"upgrade, or use Mode pglog.ModeTable (writers without pgxstore.Config.WAL)", r.fcfg.Name, version/10000, version%10000)
	}
	if !replication {
		return fmt.Errorf("log relay %s: role %s may not open a replication connection: grant it the attribute "+
			"(ALTER ROLE %s REPLICATION; on Amazon RDS: GRANT rds_replication TO %s) or connect the relay as a role that has it",
			r.fcfg.Name, role, r.ident(role), r.ident(role))
	}
	if err := r.fcfg.Store.CheckSchema(ctx); err != nil {
		if errors.Is(err, store.ErrNotMigrated) || errors.Is(err, store.ErrNewerSchema) {
			return fmt.Errorf("log relay %s: %w", r.fcfg.Name, err)
		}
		return fmt.Errorf("log relay %s: check the outbox's tables: %w", r.fcfg.Name, err)
	}
	return r.ensurePublication(ctx)
}

// ensurePublication creates the relay group's publication (INSERTs of the outbox only), or checks
// that the one there still is that.
func (r *Relay) ensurePublication(ctx context.Context) error {
	want := r.schema + ".outbox"
	for range 2 {
		var (
			all, ins, upd, del, trunc bool
			tables                    []string
		)
		err := r.cfg.Pool.QueryRow(ctx, r.sql.Publication, r.cfg.PublicationName).Scan(&all, &ins, &upd, &del, &trunc, &tables)
		if errors.Is(err, pgx.ErrNoRows) {
			_, err = r.cfg.Pool.Exec(ctx, r.sql.CreatePublication(r.cfg.PublicationName))
			if err == nil || sqlState(err) == codeDuplicateObject {
				continue // read it back; another relay may have made it first
			}
			return fmt.Errorf("log relay %s: create publication %s: %w", r.fcfg.Name, r.cfg.PublicationName, err)
		}
		if err != nil {
			return fmt.Errorf("log relay %s: read publication %s: %w", r.fcfg.Name, r.cfg.PublicationName, err)
		}
		if all || !ins || upd || del || trunc || len(tables) != 1 || tables[0] != want {
			var ops []string
			for op, on := range map[string]bool{"insert": ins, "update": upd, "delete": del, "truncate": trunc} {
				if on {
					ops = append(ops, op)
				}
			}
			what := strings.Join(tables, ", ")
			if all {
				what = "ALL TABLES"
			}
			return fatal("publication %s was altered by hand: it publishes %s of %s, and the relay needs it to publish only insert of %s; "+
				"restore it (ALTER PUBLICATION %s SET TABLE %s; ALTER PUBLICATION %s SET (publish = 'insert')) or drop it and the relay creates it again",
				r.cfg.PublicationName, strings.Join(ops, ", "), what, want,
				r.ident(r.cfg.PublicationName), r.table("outbox"), r.ident(r.cfg.PublicationName))
		}
		return nil
	}
	return fmt.Errorf("log relay %s: publication %s could not be created nor read", r.fcfg.Name, r.cfg.PublicationName)
}

// slotState is the relay group's slot as pg_replication_slots shows it.
type slotState struct {
	exists    bool
	plugin    string
	slotType  string
	database  string
	walStatus string
	confirmed pglogrepl.LSN
}

func (r *Relay) readSlot(ctx context.Context) (slotState, error) {
	var s slotState
	var confirmed *string
	err := r.cfg.Pool.QueryRow(ctx, r.sql.ReplicationSlot, r.cfg.SlotName).Scan(&s.plugin, &s.slotType, &s.database, &s.walStatus, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read replication slot %s: %w", r.cfg.SlotName, err)
	}
	s.exists = true
	if confirmed != nil {
		s.confirmed, _ = pglogrepl.ParseLSN(*confirmed)
	}
	return s, nil
}

// checkpoint is the relay group's row in log_relays.
type checkpoint struct {
	exists    bool
	mode      string
	confirmed pglogrepl.LSN // 0: a backfill was begun and not finished
}

func (r *Relay) readCheckpoint(ctx context.Context) (checkpoint, error) {
	var c checkpoint
	var lsn string
	err := r.cfg.Pool.QueryRow(ctx, r.sql.ReadCheckpoint, r.fcfg.Name).Scan(&c.mode, &lsn)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read the relay's checkpoint: %w", err)
	}
	c.exists = true
	c.confirmed, err = pglogrepl.ParseLSN(lsn)
	return c, err
}

// beginBackfill records, before the slot is made, that the rows of the outbox are to be read from
// the table: a relay that stops before the backfill ends does it again at its next start.
func (r *Relay) beginBackfill(ctx context.Context) error { return r.writeCheckpoint(ctx, 0) }

// writeCheckpoint sets the relay group's checkpoint row to lsn (0: a backfill is to be done).
func (r *Relay) writeCheckpoint(ctx context.Context, lsn pglogrepl.LSN) error {
	_, err := r.cfg.Pool.Exec(ctx, r.sql.WriteCheckpoint, r.fcfg.Name, r.cfg.SlotName, string(r.cfg.Mode), lsn.String())
	if err != nil {
		return fmt.Errorf("write the relay's checkpoint: %w", err)
	}
	return nil
}

// freeSlots says how many more replication slots the server takes.
func (r *Relay) freeSlots(ctx context.Context) (free, max int, err error) {
	err = r.cfg.Pool.QueryRow(ctx, r.sql.FreeSlots).Scan(&free, &max)
	return free, max, err
}

func (r *Relay) noFreeSlot(max int) error {
	return fatal("no free replication slot: the server's %d (max_replication_slots) are taken; drop the unused ones "+
		"(SELECT slot_name, active FROM pg_replication_slots; SELECT pg_drop_replication_slot('name')) or raise max_replication_slots "+
		"(a restart)", max)
}
