-- The outbox: one row per message written in the same transaction as the business change. SQLite
-- has one writer at a time, so seq (AUTOINCREMENT: never reused) is commit order. Times are UTC
-- text of fixed width, 2006-01-02T15:04:05.000000Z, so that they compare as they sort. A relay
-- claims rows with a lease (lease_owner, lease_until) rather than a lock held across the publish:
-- a transaction held that long would stop every writer.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    uuid             TEXT    NOT NULL,
    topic            TEXT    NOT NULL,
    partition_key    TEXT,
    payload          BLOB    NOT NULL,
    metadata         TEXT    NOT NULL,
    created_at       TEXT    NOT NULL,
    published_at     TEXT,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TEXT,
    dead_lettered_at TEXT,
    last_error       TEXT,
    lease_owner      TEXT,
    lease_until      TEXT,
    CONSTRAINT outbox_uuid_key UNIQUE (uuid),
    CONSTRAINT outbox_uuid_not_empty CHECK (uuid <> ''),
    CONSTRAINT outbox_topic_not_empty CHECK (topic <> '')
);

CREATE INDEX IF NOT EXISTS {{schema}}.outbox_pending_idx ON outbox (seq)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

CREATE INDEX IF NOT EXISTS {{schema}}.outbox_unpublished_key_idx ON outbox (partition_key, seq)
    WHERE published_at IS NULL;

CREATE INDEX IF NOT EXISTS {{schema}}.outbox_backing_off_idx ON outbox (next_attempt_at, partition_key)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL AND next_attempt_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS {{schema}}.outbox_dead_lettered_idx ON outbox (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL;

CREATE INDEX IF NOT EXISTS {{schema}}.outbox_published_at_idx ON outbox (published_at)
    WHERE published_at IS NOT NULL;
