-- Messages that arrived ahead of their key's turn (the order guard), kept until the transaction
-- that applies their predecessor applies them too. The message is acknowledged to the broker once
-- parked here, so that a broker that redelivers in place (Kafka, Redis Streams) is never blocked by it.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_parked (
    consumer      TEXT    NOT NULL,
    partition_key TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    message_id    TEXT    NOT NULL,
    topic         TEXT    NOT NULL,
    payload       BLOB    NOT NULL,
    metadata      TEXT    NOT NULL,
    parked_at     TEXT    NOT NULL,
    PRIMARY KEY (consumer, partition_key, version)
) WITHOUT ROWID;
