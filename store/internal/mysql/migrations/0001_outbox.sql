-- The outbox: one row per message written in the same transaction as the business change.
-- seq orders the rows (and, per partition_key, the publication); uuid is the message identity.
-- MySQL has no partial indexes: the pending index leads with published_at and dead_lettered_at,
-- so the relay's scan of pending rows (both NULL) stays in its own part of the index, away from
-- history. Times are UTC.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox (
    seq              BIGINT       NOT NULL AUTO_INCREMENT,
    uuid             VARCHAR(255) NOT NULL,
    topic            VARCHAR(255) NOT NULL,
    partition_key    VARCHAR(255) NULL,
    payload          LONGBLOB     NOT NULL,
    metadata         LONGTEXT     NOT NULL,
    created_at       DATETIME(6)  NOT NULL,
    published_at     DATETIME(6)  NULL,
    attempts         INT          NOT NULL DEFAULT 0,
    next_attempt_at  DATETIME(6)  NULL,
    dead_lettered_at DATETIME(6)  NULL,
    last_error       TEXT         NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY outbox_uuid_key (uuid),
    KEY outbox_pending_idx (published_at, dead_lettered_at, seq),
    KEY outbox_key_idx (partition_key, published_at, seq),
    KEY outbox_backing_off_idx (next_attempt_at, partition_key),
    KEY outbox_dead_lettered_idx (dead_lettered_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
