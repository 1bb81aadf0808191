-- A relay fleet's coordination (package fleet, store.FleetControl): its members, the leases that
-- say which member relays which outbox, and the catalog's outboxes as the members see them. Every
-- time is the database's clock in UTC (UTC_TIMESTAMP(6)). A lease row is never deleted: its token
-- is the last one given for that outbox, and the next owner's must be one more.
CREATE TABLE IF NOT EXISTS {{schema}}.fleet_members (
    fleet        VARCHAR(255) NOT NULL,
    member       VARCHAR(255) NOT NULL,
    host         VARCHAR(255) NOT NULL DEFAULT '',
    pid          INT          NOT NULL DEFAULT 0,
    started_at   DATETIME(6)  NULL,
    owned        INT          NOT NULL DEFAULT 0,
    heartbeat_at DATETIME(6)  NOT NULL,
    expires_at   DATETIME(6)  NOT NULL,
    PRIMARY KEY (fleet, member)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- owner is '' once released; expires_at is then when it was released.
CREATE TABLE IF NOT EXISTS {{schema}}.fleet_leases (
    fleet       VARCHAR(255) NOT NULL,
    outbox      VARCHAR(255) NOT NULL,
    owner       VARCHAR(255) NOT NULL DEFAULT '',
    token       BIGINT       NOT NULL,
    acquired_at DATETIME(6)  NOT NULL,
    renewed_at  DATETIME(6)  NOT NULL,
    expires_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (fleet, outbox),
    KEY fleet_leases_owner_idx (fleet, owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The backlog columns (pending, oldest_pending_us, stats_at, error) are the owner's last reading;
-- stats_at is NULL until an owner recorded one.
CREATE TABLE IF NOT EXISTS {{schema}}.fleet_outboxes (
    fleet             VARCHAR(255) NOT NULL,
    outbox            VARCHAR(255) NOT NULL,
    tenant            VARCHAR(255) NOT NULL DEFAULT '',
    disabled          TINYINT      NOT NULL DEFAULT 0,
    recorded_by       VARCHAR(255) NOT NULL,
    recorded_at       DATETIME(6)  NOT NULL,
    first_recorded_at DATETIME(6)  NOT NULL,
    pending           BIGINT       NOT NULL DEFAULT 0,
    oldest_pending_us BIGINT       NOT NULL DEFAULT 0,
    stats_at          DATETIME(6)  NULL,
    error             TEXT         NOT NULL,
    PRIMARY KEY (fleet, outbox)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
