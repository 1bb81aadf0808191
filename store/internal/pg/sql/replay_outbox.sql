-- Put dead-lettered rows back in line with a fresh attempt budget; a failure after this is grouped
-- anew. Archived rows are never replayed. $1 seqs.
--
-- The row is written again — deleted and inserted with the same seq, id and content, in the
-- replay's transaction — rather than updated: a log relay (package forwarder/pglog) reads the
-- outbox's INSERTs from the write-ahead log, in commit order, and would never see an UPDATE; the
-- polling relay sees the same row an UPDATE would leave (same seq, so the same place in its key's
-- order). The count is the rows replayed.
WITH replayed AS (
    DELETE FROM {{schema}}.outbox
    WHERE seq = ANY($1::bigint[])
      AND dead_lettered_at IS NOT NULL
      AND published_at IS NULL
      AND archived_at IS NULL
    RETURNING uuid, uuid_text, seq, topic, partition_key, payload, metadata, created_at, last_error, event_type
)
INSERT INTO {{schema}}.outbox (uuid, uuid_text, seq, topic, partition_key, payload, metadata, created_at, last_error, event_type)
OVERRIDING SYSTEM VALUE
SELECT uuid, uuid_text, seq, topic, partition_key, payload, metadata, created_at, last_error, event_type
FROM replayed
ORDER BY seq
