-- A relay fleet's coordination (package fleet, store.FleetControl): its members, the leases that
-- say which member relays which outbox, and the catalog's outboxes as the members see them. Times
-- are SQLite's own clock (strftime 'now': the host's, shared by every process that opens the
-- file), as UTC text of fixed width that sorts as it compares. A lease row is never deleted: its
-- token is the last one given for that outbox, and the next owner's must be one more.
CREATE TABLE IF NOT EXISTS {{schema}}.fleet_members (
    fleet        TEXT    NOT NULL,
    member       TEXT    NOT NULL,
    host         TEXT    NOT NULL DEFAULT '',
    pid          INTEGER NOT NULL DEFAULT 0,
    started_at   TEXT,
    owned        INTEGER NOT NULL DEFAULT 0,
    heartbeat_at TEXT    NOT NULL,
    expires_at   TEXT    NOT NULL,
    PRIMARY KEY (fleet, member)
) WITHOUT ROWID;

-- owner is '' once released; expires_at is then when it was released.
CREATE TABLE IF NOT EXISTS {{schema}}.fleet_leases (
    fleet       TEXT    NOT NULL,
    outbox      TEXT    NOT NULL,
    owner       TEXT    NOT NULL DEFAULT '',
    token       INTEGER NOT NULL,
    acquired_at TEXT    NOT NULL,
    renewed_at  TEXT    NOT NULL,
    expires_at  TEXT    NOT NULL,
    PRIMARY KEY (fleet, outbox)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{schema}}.fleet_leases_owner_idx ON fleet_leases (fleet, owner);

-- The backlog columns (pending, oldest_pending_us, stats_at, error) are the owner's last reading;
-- stats_at is NULL until an owner recorded one.
CREATE TABLE IF NOT EXISTS {{schema}}.fleet_outboxes (
    fleet             TEXT    NOT NULL,
    outbox            TEXT    NOT NULL,
    tenant            TEXT    NOT NULL DEFAULT '',
    disabled          INTEGER NOT NULL DEFAULT 0,
    recorded_by       TEXT    NOT NULL,
    recorded_at       TEXT    NOT NULL,
    first_recorded_at TEXT    NOT NULL,
    pending           INTEGER NOT NULL DEFAULT 0,
    oldest_pending_us INTEGER NOT NULL DEFAULT 0,
    stats_at          TEXT,
    error             TEXT    NOT NULL DEFAULT '',
    PRIMARY KEY (fleet, outbox)
) WITHOUT ROWID;
