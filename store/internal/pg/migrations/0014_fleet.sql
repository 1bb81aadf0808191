-- A relay fleet's coordination (package fleet, store.FleetControl): its members, the leases that
-- say which member relays which outbox, and the catalog's outboxes as the members see them. Every
-- time is the database's clock. A lease row is never deleted: its token is the last one given for
-- that outbox, and the next owner's must be one more, however long the outbox was gone.
CREATE TABLE {{schema}}.fleet_members (
    fleet        text        NOT NULL,
    member       text        NOT NULL,
    host         text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    started_at   timestamptz,
    owned        integer     NOT NULL DEFAULT 0,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (fleet, member)
);

-- owner is '' once released; expires_at is then when it was released.
CREATE TABLE {{schema}}.fleet_leases (
    fleet       text        NOT NULL,
    outbox      text        NOT NULL,
    owner       text        NOT NULL DEFAULT '',
    token       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (fleet, outbox)
);
CREATE INDEX fleet_leases_owner_idx ON {{schema}}.fleet_leases (fleet, owner);

-- The backlog columns (pending, oldest_pending_us, stats_at, error) are the owner's last reading;
-- stats_at is NULL until an owner recorded one.
CREATE TABLE {{schema}}.fleet_outboxes (
    fleet             text        NOT NULL,
    outbox            text        NOT NULL,
    tenant            text        NOT NULL DEFAULT '',
    disabled          boolean     NOT NULL DEFAULT false,
    recorded_by       text        NOT NULL,
    recorded_at       timestamptz NOT NULL,
    first_recorded_at timestamptz NOT NULL,
    pending           bigint      NOT NULL DEFAULT 0,
    oldest_pending_us bigint      NOT NULL DEFAULT 0,
    stats_at          timestamptz,
    error             text        NOT NULL DEFAULT '',
    PRIMARY KEY (fleet, outbox)
);
