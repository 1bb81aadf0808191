-- Messages that arrived ahead of their key's turn (the order guard), kept until the transaction
-- that applies their predecessor applies them too. The message is acknowledged to the broker once
-- parked here, so that a broker that redelivers in place (Kafka, Redis Streams) is never blocked by it.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_parked (
    consumer      VARCHAR(100) NOT NULL,
    partition_key VARCHAR(255) NOT NULL,
    version       BIGINT       NOT NULL,
    message_id    VARCHAR(255) NOT NULL,
    topic         VARCHAR(255) NOT NULL,
    payload       LONGBLOB     NOT NULL,
    metadata      LONGTEXT     NOT NULL,
    parked_at     DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, partition_key, version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
