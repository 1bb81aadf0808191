-- The inbox: one row per message a consumer has processed, written in the same transaction as the
-- effect. Its primary key is the deduplication.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox (
    consumer     TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    processed_at TEXT    NOT NULL,
    duplicates   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS {{schema}}.inbox_processed_at_idx ON inbox (processed_at);

-- Deliveries per message, counted in their own commit before the handler runs.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_deliveries (
    consumer      TEXT    NOT NULL,
    message_id    TEXT    NOT NULL,
    deliveries    INTEGER NOT NULL,
    last_error    TEXT,
    first_seen_at TEXT    NOT NULL,
    last_seen_at  TEXT    NOT NULL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS {{schema}}.inbox_deliveries_last_seen_at_idx ON inbox_deliveries (last_seen_at);

-- Messages a consumer quarantined, as received, until an operator replays them.
CREATE TABLE IF NOT EXISTS {{schema}}.dead_letters (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer         TEXT    NOT NULL,
    topic            TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    payload          BLOB    NOT NULL,
    metadata         TEXT    NOT NULL,
    reason           TEXT    NOT NULL,
    deliveries       INTEGER NOT NULL,
    dead_lettered_at TEXT    NOT NULL,
    replayed_at      TEXT
);

CREATE UNIQUE INDEX IF NOT EXISTS {{schema}}.dead_letters_consumer_message_key ON dead_letters (consumer, message_id)
    WHERE message_id <> '';

CREATE INDEX IF NOT EXISTS {{schema}}.dead_letters_waiting_idx ON dead_letters (consumer, dead_lettered_at)
    WHERE replayed_at IS NULL;

-- The last aggregate version each consumer applied per key, for the opt-in order guard.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_versions (
    consumer      TEXT    NOT NULL,
    partition_key TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    updated_at    TEXT    NOT NULL,
    PRIMARY KEY (consumer, partition_key)
) WITHOUT ROWID;
