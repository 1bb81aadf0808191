-- The outbox row at the price of a plain INSERT. A row is now maintained in two indexes when it is
-- written, where it was four:
--   * the primary key is the message id itself, a 16-byte uuid (UUIDv7 from pipeline.NewEvent, so
--     inserts append at the right edge of the index); it is the uniqueness guard the text UNIQUE
--     index was. An id that is not a canonical lowercase UUID keeps its text in uuid_text and its
--     md5 as the key (a collision can only refuse a write, never admit a duplicate);
--   * the pending index, which the claim walks both for its window and for the per-key gap probe
--     (one bounded range scan below the window, where the key index was probed once per key).
-- seq stays the relay order; nothing looks a row up by seq outside the pending, dead-letter and
-- retention indexes, whose predicates keep new rows out of the last two. metadata is text: the relay
-- decodes it, nothing queries into it, and jsonb parsed it on every insert.
--
-- The upgrade swaps tables instead of rewriting one: it locks the old outbox, renames it
-- outbox_v5, creates the new table and moves only the unpublished rows (pending and dead letters)
-- across, keeping their seq. The lock lasts as long as moving the backlog takes, not the history:
-- published rows stay in outbox_v5, which outboxkit no longer reads or writes (drop it once its
-- rows are past your retention; it is dropped here at once when it is empty).
LOCK TABLE {{schema}}.outbox IN ACCESS EXCLUSIVE MODE;
ALTER TABLE {{schema}}.outbox RENAME TO outbox_v5;
ALTER INDEX {{schema}}.outbox_pkey RENAME TO outbox_v5_pkey;
ALTER INDEX {{schema}}.outbox_uuid_key RENAME TO outbox_v5_uuid_key;
ALTER INDEX {{schema}}.outbox_pending_idx RENAME TO outbox_v5_pending_idx;
ALTER INDEX {{schema}}.outbox_unpublished_key_idx RENAME TO outbox_v5_unpublished_key_idx;
ALTER INDEX {{schema}}.outbox_dead_lettered_idx RENAME TO outbox_v5_dead_lettered_idx;
ALTER INDEX {{schema}}.outbox_published_at_idx RENAME TO outbox_v5_published_at_idx;
ALTER INDEX {{schema}}.outbox_backing_off_idx RENAME TO outbox_v5_backing_off_idx;
ALTER SEQUENCE {{schema}}.outbox_seq_seq RENAME TO outbox_v5_seq_seq;

CREATE TABLE {{schema}}.outbox (
    uuid             uuid        NOT NULL,
    uuid_text        text,
    seq              bigint      GENERATED ALWAYS AS IDENTITY,
    topic            text        NOT NULL,
    partition_key    text,
    payload          bytea       NOT NULL,
    metadata         text        NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at     timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    dead_lettered_at timestamptz,
    last_error       text,
    CONSTRAINT outbox_uuid_key PRIMARY KEY (uuid),
    CONSTRAINT outbox_uuid_text_not_empty CHECK (uuid_text <> ''),
    CONSTRAINT outbox_topic_not_empty CHECK (topic <> '')
);

-- Rows the relay may still have to publish, in relay order: the claim's window, its per-key gap
-- probe, and the mark of what a pass claimed. Published and dead-lettered rows leave it.
CREATE INDEX outbox_pending_idx ON {{schema}}.outbox (seq)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Rows backing off after a failure (the claim skips their keys). New rows are not in it.
CREATE INDEX outbox_backing_off_idx ON {{schema}}.outbox (next_attempt_at, partition_key)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL AND next_attempt_at IS NOT NULL;

-- Dead letters, for stats, listings, replay and parking keys. New rows are not in it.
CREATE INDEX outbox_dead_lettered_idx ON {{schema}}.outbox (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL;

-- Published rows by age, for retention. New rows are not in it.
CREATE INDEX outbox_published_at_idx ON {{schema}}.outbox (published_at)
    WHERE published_at IS NOT NULL;

SELECT setval(pg_get_serial_sequence('{{schema}}.outbox', 'seq'),
              coalesce((SELECT max(seq) FROM {{schema}}.outbox_v5), 0) + 1, false);

INSERT INTO {{schema}}.outbox (uuid, uuid_text, seq, topic, partition_key, payload, metadata, created_at,
                               attempts, next_attempt_at, dead_lettered_at, last_error)
OVERRIDING SYSTEM VALUE
SELECT CASE WHEN canonical THEN o.uuid::uuid ELSE md5(o.uuid)::uuid END,
       CASE WHEN canonical THEN NULL ELSE o.uuid END,
       o.seq, o.topic, o.partition_key, o.payload, o.metadata::text, o.created_at,
       o.attempts, o.next_attempt_at, o.dead_lettered_at, o.last_error
FROM {{schema}}.outbox_v5 AS o,
     LATERAL (SELECT o.uuid ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' AS canonical) AS c
WHERE o.published_at IS NULL
ORDER BY o.seq;

DELETE FROM {{schema}}.outbox_v5 WHERE published_at IS NULL;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_v5) THEN
        DROP TABLE {{schema}}.outbox_v5;
    END IF;
END $$;
