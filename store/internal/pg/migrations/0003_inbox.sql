-- The inbox: one row per message a consumer has processed, written in the same transaction as the
-- effect. Its primary key is the deduplication: a second delivery conflicts and is acknowledged.
CREATE TABLE {{schema}}.inbox (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL,
    duplicates   integer     NOT NULL DEFAULT 0, -- deliveries absorbed after the first
    PRIMARY KEY (consumer, message_id)
);

-- Pruning by age.
CREATE INDEX inbox_processed_at_idx ON {{schema}}.inbox (processed_at);

-- Deliveries per message, counted in their own commit before the handler runs, so that a message
-- which kills the process is still counted and can be quarantined.
CREATE TABLE {{schema}}.inbox_deliveries (
    consumer      text        NOT NULL,
    message_id    text        NOT NULL,
    deliveries    integer     NOT NULL,
    last_error    text,
    first_seen_at timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX inbox_deliveries_last_seen_at_idx ON {{schema}}.inbox_deliveries (last_seen_at);

-- Messages a consumer quarantined, as received, until an operator replays them.
CREATE TABLE {{schema}}.dead_letters (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer         text        NOT NULL,
    topic            text        NOT NULL,
    message_id       text        NOT NULL,
    payload          bytea       NOT NULL,
    metadata         jsonb       NOT NULL,
    reason           text        NOT NULL,
    deliveries       integer     NOT NULL,
    dead_lettered_at timestamptz NOT NULL,
    replayed_at      timestamptz
);

-- One dead letter per message and consumer (quarantined again after a replay, it is updated).
-- Messages without an id each keep a row of their own.
CREATE UNIQUE INDEX dead_letters_consumer_message_key ON {{schema}}.dead_letters (consumer, message_id)
    WHERE message_id <> '';

CREATE INDEX dead_letters_waiting_idx ON {{schema}}.dead_letters (consumer, dead_lettered_at)
    WHERE replayed_at IS NULL;

-- The last aggregate version each consumer applied per key, for the opt-in order guard.
CREATE TABLE {{schema}}.inbox_versions (
    consumer      text        NOT NULL,
    partition_key text        NOT NULL,
    version       bigint      NOT NULL,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (consumer, partition_key)
);
