-- The inbox: one row per message a consumer has processed, written in the same transaction as the
-- effect. Its primary key is the deduplication.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox (
    consumer     VARCHAR(100) NOT NULL,
    message_id   VARCHAR(255) NOT NULL,
    processed_at DATETIME(6)  NOT NULL,
    duplicates   INT          NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id),
    KEY inbox_processed_at_idx (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Deliveries per message, counted in their own commit before the handler runs.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_deliveries (
    consumer      VARCHAR(100) NOT NULL,
    message_id    VARCHAR(255) NOT NULL,
    deliveries    INT          NOT NULL,
    last_error    TEXT         NULL,
    first_seen_at DATETIME(6)  NOT NULL,
    last_seen_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY inbox_deliveries_last_seen_at_idx (last_seen_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Messages a consumer quarantined, as received, until an operator replays them. A message without
-- an id is kept with a NULL message_id, so that each keeps a row of its own.
CREATE TABLE IF NOT EXISTS {{schema}}.dead_letters (
    id               BIGINT       NOT NULL AUTO_INCREMENT,
    consumer         VARCHAR(100) NOT NULL,
    topic            VARCHAR(255) NOT NULL,
    message_id       VARCHAR(255) NULL,
    payload          LONGBLOB     NOT NULL,
    metadata         LONGTEXT     NOT NULL,
    reason           TEXT         NOT NULL,
    deliveries       INT          NOT NULL,
    dead_lettered_at DATETIME(6)  NOT NULL,
    replayed_at      DATETIME(6)  NULL,
    PRIMARY KEY (id),
    UNIQUE KEY dead_letters_consumer_message_key (consumer, message_id),
    KEY dead_letters_waiting_idx (consumer, replayed_at, dead_lettered_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The last aggregate version each consumer applied per key, for the opt-in order guard.
CREATE TABLE IF NOT EXISTS {{schema}}.inbox_versions (
    consumer      VARCHAR(100) NOT NULL,
    partition_key VARCHAR(255) NOT NULL,
    version       BIGINT       NOT NULL,
    updated_at    DATETIME(6)  NOT NULL,
    PRIMARY KEY (consumer, partition_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
