-- The operator console (package console). New columns are NULL on every row that is not a dead
-- letter; every new outbox index is partial on dead letters, so inserts never touch them.
-- "Waiting" is the same predicate everywhere: outbox — dead-lettered, unpublished, not archived;
-- consumers — not replayed, not archived. The claim, the stats and these indexes agree on it.
ALTER TABLE {{schema}}.outbox ADD COLUMN event_type TEXT;
ALTER TABLE {{schema}}.outbox ADD COLUMN failure_group INTEGER;
ALTER TABLE {{schema}}.outbox ADD COLUMN archived_at TEXT;
ALTER TABLE {{schema}}.dead_letters ADD COLUMN partition_key TEXT;
ALTER TABLE {{schema}}.dead_letters ADD COLUMN event_type TEXT;
ALTER TABLE {{schema}}.dead_letters ADD COLUMN failure_group INTEGER;
ALTER TABLE {{schema}}.dead_letters ADD COLUMN source_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{schema}}.dead_letters ADD COLUMN archived_at TEXT;

CREATE INDEX IF NOT EXISTS {{schema}}.outbox_dead_waiting_idx ON outbox (dead_lettered_at, seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.outbox_dead_group_idx ON outbox (failure_group, dead_lettered_at, seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.outbox_dead_key_idx ON outbox (partition_key, dead_lettered_at, seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.outbox_archived_idx ON outbox (dead_lettered_at, seq)
    WHERE archived_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.outbox_ungrouped_idx ON outbox (seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND failure_group IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_console_consumer_idx ON dead_letters (consumer, dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_console_time_idx ON dead_letters (dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_console_group_idx ON dead_letters (consumer, failure_group, dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_console_key_idx ON dead_letters (partition_key, dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_console_seq_idx ON dead_letters (source_seq, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_archived_idx ON dead_letters (dead_lettered_at, id)
    WHERE archived_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_ungrouped_idx ON dead_letters (id)
    WHERE failure_group IS NULL;

CREATE TABLE IF NOT EXISTS {{schema}}.pauses (
    scope     TEXT NOT NULL CHECK (scope IN ('topic', 'relay')),
    name      TEXT NOT NULL,
    paused_by TEXT NOT NULL,
    reason    TEXT NOT NULL DEFAULT '',
    paused_at TEXT NOT NULL,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS {{schema}}.relays (
    owner              TEXT    PRIMARY KEY,
    name               TEXT    NOT NULL,
    host               TEXT    NOT NULL,
    pid                INTEGER NOT NULL,
    started_at         TEXT    NOT NULL,
    heartbeat_at       TEXT    NOT NULL,
    last_pass_at       TEXT,
    last_publish_at    TEXT,
    circuit_open_since TEXT,
    blocked            TEXT    NOT NULL DEFAULT '',
    published_total    INTEGER NOT NULL DEFAULT 0,
    published_by_topic TEXT    NOT NULL DEFAULT '{}',
    pauses_seen_at     TEXT
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS {{schema}}.console_jobs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT    NOT NULL CHECK (kind IN ('replay', 'archive')),
    side            TEXT    NOT NULL CHECK (side IN ('outbox', 'consumers')),
    filter          TEXT    NOT NULL,
    request_key     TEXT    NOT NULL UNIQUE,
    snapshot_max_id INTEGER NOT NULL,
    snapshot_at     TEXT    NOT NULL,
    rate            INTEGER NOT NULL,
    expected        INTEGER NOT NULL DEFAULT 0,
    total           INTEGER NOT NULL DEFAULT 0,
    state           TEXT    NOT NULL,
    cursor_seq      INTEGER NOT NULL DEFAULT 0,
    cursor_id       INTEGER NOT NULL DEFAULT 0,
    applied         INTEGER NOT NULL DEFAULT 0,
    skipped         INTEGER NOT NULL DEFAULT 0,
    failed          INTEGER NOT NULL DEFAULT 0,
    owner           TEXT    NOT NULL DEFAULT '',
    lease_until     TEXT,
    lease_token     INTEGER NOT NULL DEFAULT 0,
    created_by      TEXT    NOT NULL,
    created_at      TEXT    NOT NULL,
    started_at      TEXT,
    finished_at     TEXT,
    cancel_by       TEXT    NOT NULL DEFAULT '',
    cancel_at       TEXT,
    waiting         TEXT    NOT NULL DEFAULT '',
    last_error      TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS {{schema}}.console_jobs_open_idx ON console_jobs (id)
    WHERE state IN ('queued', 'running', 'waiting', 'cancelling');

CREATE TABLE IF NOT EXISTS {{schema}}.console_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       TEXT    NOT NULL,
    actor    TEXT    NOT NULL,
    role     TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    filter   TEXT    NOT NULL DEFAULT '',
    matched  INTEGER NOT NULL DEFAULT 0,
    affected INTEGER NOT NULL DEFAULT 0,
    job_id   INTEGER NOT NULL DEFAULT 0,
    result   TEXT    NOT NULL,
    ok       INTEGER NOT NULL
);
