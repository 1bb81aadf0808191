-- The binlog relays' checkpoints: one row per relay group (the forwarder's Name), in the outbox's
-- database. progress says how the relay tracks it: 'gtid', by gtid_set, the GTID set read up to
-- (MariaDB's domain-server-seq per domain, or MySQL's uuid:intervals; '' is the start of the
-- binary log), or 'file', by file and pos. file and pos are where the last transaction behind the
-- checkpoint ends in the binary log (with 'gtid', for an operator's eyes). backfilled is 0 until
-- the first start's reading of the table has published every row it found — and again from a
-- recovery (the server could not send the log from the checkpoint) until its reading has.
CREATE TABLE IF NOT EXISTS {{schema}}.binlog_relays (
    name       VARCHAR(255)    NOT NULL,
    flavor     VARCHAR(16)     NOT NULL,
    server_id  INT UNSIGNED    NOT NULL,
    progress   VARCHAR(8)      NOT NULL,
    gtid_set   LONGTEXT        NOT NULL,
    file       VARCHAR(512)    NOT NULL,
    pos        BIGINT UNSIGNED NOT NULL,
    backfilled TINYINT         NOT NULL,
    updated_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
