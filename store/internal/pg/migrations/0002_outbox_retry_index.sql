-- Rows backing off after a failure. Only failed rows have next_attempt_at set, so this index stays
-- tiny and inserts never touch it. The relay reads it to skip every key that must wait.
CREATE INDEX outbox_backing_off_idx ON {{schema}}.outbox (next_attempt_at, partition_key)
    WHERE published_at IS NULL AND dead_lettered_at IS NULL AND next_attempt_at IS NOT NULL;
