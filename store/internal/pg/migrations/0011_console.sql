-- The operator console (package console). New columns are NULL on every row that is not a dead
-- letter, so writers of the outbox pay nothing (ADD COLUMN without a default only changes the
-- catalogue). The indexes that serve the console come in 0012, built without blocking writers.
--
-- outbox: a dead letter's event type and failure group (store.FailureGroupOf, computed in Go
-- when it is dead-lettered), and when an operator archived it (never deleted by an action).
ALTER TABLE {{schema}}.outbox
    ADD COLUMN event_type    text,
    ADD COLUMN failure_group bigint,
    ADD COLUMN archived_at   timestamptz;

-- dead_letters: the same, and the partition key and outbox seq of the message (from its
-- metadata), which a replay job sends each key's letters in order by. Filled when a message is
-- dead-lettered; for letters stored before, by the console's Regroup.
ALTER TABLE {{schema}}.dead_letters
    ADD COLUMN partition_key text,
    ADD COLUMN event_type    text,
    ADD COLUMN failure_group bigint,
    ADD COLUMN source_seq    bigint NOT NULL DEFAULT 0,
    ADD COLUMN archived_at   timestamptz;

-- Topics and relays an operator paused: the claim skips them, and relays check between rows.
CREATE TABLE {{schema}}.pauses (
    scope     text        NOT NULL CHECK (scope IN ('topic', 'relay')),
    name      text        NOT NULL,
    paused_by text        NOT NULL,
    reason    text        NOT NULL DEFAULT '',
    paused_at timestamptz NOT NULL,
    PRIMARY KEY (scope, name)
);

-- Each relay's heartbeat: what the console's overview shows of relays in other processes.
CREATE TABLE {{schema}}.relays (
    owner              text        PRIMARY KEY,
    name               text        NOT NULL,
    host               text        NOT NULL,
    pid                integer     NOT NULL,
    started_at         timestamptz NOT NULL,
    heartbeat_at       timestamptz NOT NULL,
    last_pass_at       timestamptz,
    last_publish_at    timestamptz,
    circuit_open_since timestamptz,
    blocked            text        NOT NULL DEFAULT '',
    published_total    bigint      NOT NULL DEFAULT 0,
    published_by_topic text        NOT NULL DEFAULT '{}',
    pauses_seen_at     timestamptz
);

-- Replays and archives of many letters, run by any console at a set rate. The selection is frozen
-- by snapshot_max_id and snapshot_at; the cursor makes a job resumable by another console; every
-- write checks owner and lease_token, so a runner that lost its lease changes nothing.
CREATE TABLE {{schema}}.console_jobs (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind IN ('replay', 'archive')),
    side            text        NOT NULL CHECK (side IN ('outbox', 'consumers')),
    filter          text        NOT NULL,
    request_key     text        NOT NULL,
    snapshot_max_id bigint      NOT NULL,
    snapshot_at     timestamptz NOT NULL,
    rate            integer     NOT NULL,
    expected        bigint      NOT NULL DEFAULT 0,
    total           bigint      NOT NULL DEFAULT 0,
    state           text        NOT NULL,
    cursor_seq      bigint      NOT NULL DEFAULT 0,
    cursor_id       bigint      NOT NULL DEFAULT 0,
    applied         bigint      NOT NULL DEFAULT 0,
    skipped         bigint      NOT NULL DEFAULT 0,
    failed          bigint      NOT NULL DEFAULT 0,
    owner           text        NOT NULL DEFAULT '',
    lease_until     timestamptz,
    lease_token     bigint      NOT NULL DEFAULT 0,
    created_by      text        NOT NULL,
    created_at      timestamptz NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz,
    cancel_by       text        NOT NULL DEFAULT '',
    cancel_at       timestamptz,
    waiting         text        NOT NULL DEFAULT '',
    last_error      text        NOT NULL DEFAULT '',
    CONSTRAINT console_jobs_request_key UNIQUE (request_key)
);
CREATE INDEX console_jobs_open_idx ON {{schema}}.console_jobs (id)
    WHERE state IN ('queued', 'running', 'waiting', 'cancelling');

-- Every action taken or refused in the console. Never pruned by outboxkit.
CREATE TABLE {{schema}}.console_audit (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL,
    actor    text        NOT NULL,
    role     text        NOT NULL,
    action   text        NOT NULL,
    filter   text        NOT NULL DEFAULT '',
    matched  bigint      NOT NULL DEFAULT 0,
    affected bigint      NOT NULL DEFAULT 0,
    job_id   bigint      NOT NULL DEFAULT 0,
    result   text        NOT NULL,
    ok       boolean     NOT NULL
);
