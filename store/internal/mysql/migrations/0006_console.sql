-- The operator console (package console). New outbox columns are NULL on every row that is not a
-- dead letter and added in place (no table copy), and the outbox gets no new index: MySQL has no
-- partial indexes, so each would cost every insert an entry. The console reads the outbox's dead
-- letters through outbox_dead_lettered_idx (its secondary entries carry seq) with bounded scans.
-- DDL is not transactional here: a migration cut short runs again whole, and the runner takes a
-- column or key that exists already as done.
ALTER TABLE {{schema}}.outbox
    ADD COLUMN event_type    VARCHAR(255) NULL,
    ADD COLUMN failure_group BIGINT       NULL,
    ADD COLUMN archived_at   DATETIME(6)  NULL;

ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN partition_key VARCHAR(255) NULL,
    ADD COLUMN event_type    VARCHAR(255) NULL,
    ADD COLUMN failure_group BIGINT       NULL,
    ADD COLUMN source_seq    BIGINT       NOT NULL DEFAULT 0,
    ADD COLUMN archived_at   DATETIME(6)  NULL;

-- "Waiting" as a column leading every index: with replayed_at IS NULL AND archived_at IS NULL
-- leading instead, the optimiser reads the NULL prefix by ref and a deep page reads every newer
-- letter (measured on MariaDB 10.11: 0.65–1.1 s at a million letters, 0.5 ms with this column).
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN waiting TINYINT AS (IF(replayed_at IS NULL AND archived_at IS NULL, 1, 0)) VIRTUAL;

ALTER TABLE {{schema}}.dead_letters
    ADD KEY dead_letters_console_consumer_idx (waiting, consumer, dead_lettered_at, id),
    ADD KEY dead_letters_console_time_idx (waiting, dead_lettered_at, id),
    ADD KEY dead_letters_console_group_idx (waiting, consumer, failure_group, dead_lettered_at, id),
    ADD KEY dead_letters_console_key_idx (waiting, partition_key, dead_lettered_at, id),
    ADD KEY dead_letters_console_seq_idx (waiting, source_seq, id),
    ADD KEY dead_letters_archived_idx (archived_at, id),
    ADD KEY dead_letters_ungrouped_idx (failure_group, id);

CREATE TABLE IF NOT EXISTS {{schema}}.pauses (
    scope     VARCHAR(16)  NOT NULL,
    name      VARCHAR(255) NOT NULL,
    paused_by VARCHAR(255) NOT NULL,
    reason    TEXT         NOT NULL,
    paused_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (scope, name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{schema}}.relays (
    owner              VARCHAR(255) NOT NULL,
    name               VARCHAR(255) NOT NULL,
    host               VARCHAR(255) NOT NULL,
    pid                INT          NOT NULL,
    started_at         DATETIME(6)  NOT NULL,
    heartbeat_at       DATETIME(6)  NOT NULL,
    last_pass_at       DATETIME(6)  NULL,
    last_publish_at    DATETIME(6)  NULL,
    circuit_open_since DATETIME(6)  NULL,
    blocked            TEXT         NOT NULL,
    published_total    BIGINT       NOT NULL DEFAULT 0,
    published_by_topic LONGTEXT     NOT NULL,
    pauses_seen_at     DATETIME(6)  NULL,
    PRIMARY KEY (owner)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{schema}}.console_jobs (
    id              BIGINT       NOT NULL AUTO_INCREMENT,
    kind            VARCHAR(16)  NOT NULL,
    side            VARCHAR(16)  NOT NULL,
    filter          LONGTEXT     NOT NULL,
    request_key     VARCHAR(255) NOT NULL,
    snapshot_max_id BIGINT       NOT NULL,
    snapshot_at     DATETIME(6)  NOT NULL,
    rate            INT          NOT NULL,
    expected        BIGINT       NOT NULL DEFAULT 0,
    total           BIGINT       NOT NULL DEFAULT 0,
    state           VARCHAR(16)  NOT NULL,
    cursor_seq      BIGINT       NOT NULL DEFAULT 0,
    cursor_id       BIGINT       NOT NULL DEFAULT 0,
    applied         BIGINT       NOT NULL DEFAULT 0,
    skipped         BIGINT       NOT NULL DEFAULT 0,
    failed          BIGINT       NOT NULL DEFAULT 0,
    owner           VARCHAR(255) NOT NULL DEFAULT '',
    lease_until     DATETIME(6)  NULL,
    lease_token     BIGINT       NOT NULL DEFAULT 0,
    created_by      VARCHAR(255) NOT NULL,
    created_at      DATETIME(6)  NOT NULL,
    started_at      DATETIME(6)  NULL,
    finished_at     DATETIME(6)  NULL,
    cancel_by       VARCHAR(255) NOT NULL DEFAULT '',
    cancel_at       DATETIME(6)  NULL,
    waiting         TEXT         NOT NULL,
    last_error      TEXT         NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY console_jobs_request_key (request_key),
    KEY console_jobs_state_idx (state, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{schema}}.console_audit (
    id       BIGINT       NOT NULL AUTO_INCREMENT,
    at       DATETIME(6)  NOT NULL,
    actor    VARCHAR(255) NOT NULL,
    role     VARCHAR(32)  NOT NULL,
    action   VARCHAR(64)  NOT NULL,
    filter   TEXT         NOT NULL,
    matched  BIGINT       NOT NULL DEFAULT 0,
    affected BIGINT       NOT NULL DEFAULT 0,
    job_id   BIGINT       NOT NULL DEFAULT 0,
    result   TEXT         NOT NULL,
    ok       TINYINT      NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
