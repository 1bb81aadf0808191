-- The log relay's progress (package forwarder/pglog), one row per relay group: the replication
-- slot it reads, its writer mode, and the last position it confirmed with every event below it
-- published. The row is written together with the bulk removal of the published outbox rows behind
-- that position, so the rows left in the outbox are exactly the ones the relay may not have
-- published: what a lost slot's backfill reads. Its presence also tells a lost slot from a first
-- start.
CREATE TABLE {{schema}}.log_relays (
    name          text        PRIMARY KEY,
    slot_name     text        NOT NULL,
    mode          text        NOT NULL,
    confirmed_lsn pg_lsn      NOT NULL DEFAULT '0/0',
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
