-- Messages that arrived ahead of their key's turn (the order guard), kept until the transaction
-- that applies their predecessor applies them too. The message is acknowledged to the broker once
-- parked here, so that a broker that redelivers in place (Kafka, Redis Streams) is never blocked by it.
CREATE TABLE {{schema}}.inbox_parked (
    consumer      text        NOT NULL,
    partition_key text        NOT NULL,
    version       bigint      NOT NULL,
    message_id    text        NOT NULL,
    topic         text        NOT NULL,
    payload       bytea       NOT NULL,
    metadata      jsonb       NOT NULL,
    parked_at     timestamptz NOT NULL,
    PRIMARY KEY (consumer, partition_key, version)
);
