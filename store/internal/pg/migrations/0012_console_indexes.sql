-- outboxkit:no-transaction
-- The console's indexes. Each CREATE INDEX reads the whole table; on a live outbox a plain build
-- would hold its writers for the build's length, so on a large table these run CONCURRENTLY,
-- outside a transaction, one by one (an index a crash left invalid is dropped and built again);
-- on a small one (a new schema) they run in one transaction, which is instant and waits for no
-- unrelated transaction. Every outbox index is partial on dead letters: inserts never touch them.
--
-- "Waiting" is the same predicate everywhere: outbox — dead-lettered, unpublished, not archived;
-- consumers — not replayed, not archived. The claim, the stats and these indexes agree on it.
CREATE INDEX IF NOT EXISTS outbox_dead_waiting_idx ON {{schema}}.outbox (dead_lettered_at, seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_dead_group_idx ON {{schema}}.outbox (failure_group, dead_lettered_at, seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_dead_key_idx ON {{schema}}.outbox (partition_key, dead_lettered_at, seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL;
-- By seq: a letter's detail page, and a job's walk in key order (the primary key is the uuid).
CREATE INDEX IF NOT EXISTS outbox_dead_seq_idx ON {{schema}}.outbox (seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_archived_idx ON {{schema}}.outbox (dead_lettered_at, seq)
    WHERE archived_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX IF NOT EXISTS dead_letters_console_consumer_idx ON {{schema}}.dead_letters (consumer, dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS dead_letters_console_time_idx ON {{schema}}.dead_letters (dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS dead_letters_console_group_idx ON {{schema}}.dead_letters (consumer, failure_group, dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS dead_letters_console_key_idx ON {{schema}}.dead_letters (partition_key, dead_lettered_at, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS dead_letters_console_seq_idx ON {{schema}}.dead_letters (source_seq, id)
    WHERE replayed_at IS NULL AND archived_at IS NULL;
CREATE INDEX IF NOT EXISTS dead_letters_archived_idx ON {{schema}}.dead_letters (dead_lettered_at, id)
    WHERE archived_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS dead_letters_ungrouped_idx ON {{schema}}.dead_letters (id)
    WHERE failure_group IS NULL;
CREATE INDEX IF NOT EXISTS outbox_ungrouped_idx ON {{schema}}.outbox (seq)
    WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND failure_group IS NULL;
