-- The outbox: one row per message written in the same transaction as the business change.
-- seq orders the rows (and, per partition_key, the publication); uuid is the message identity that
-- travels to the broker and into every consumer's inbox.
CREATE TABLE {{schema}}.outbox (
    seq              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uuid             text        NOT NULL,
    topic            text        NOT NULL,
    partition_key    text,
    payload          bytea       NOT NULL,
    metadata         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at     timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    dead_lettered_at timestamptz,
    last_error       text,
    CONSTRAINT outbox_uuid_key UNIQUE (uuid),
    CONSTRAINT outbox_uuid_not_empty CHECK (uuid <> ''),
    CONSTRAINT outbox_topic_not_empty CHECK (topic <> '')
);

-- Rows the relay may still have to publish, in relay order. Published and dead-lettered rows leave
-- this index, so the relay's scan never walks history.
CREATE INDEX outbox_pending_idx ON {{schema}}.outbox (seq)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Unpublished rows per key: "is there an earlier row of this key still waiting?" is one probe.
CREATE INDEX outbox_unpublished_key_idx ON {{schema}}.outbox (partition_key, seq)
    WHERE published_at IS NULL;

-- Dead letters, for stats and operator listings.
CREATE INDEX outbox_dead_lettered_idx ON {{schema}}.outbox (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL;

-- Published rows by age, for retention. Pending rows are not in it, so inserts do not pay for it.
CREATE INDEX outbox_published_at_idx ON {{schema}}.outbox (published_at)
    WHERE published_at IS NOT NULL;
