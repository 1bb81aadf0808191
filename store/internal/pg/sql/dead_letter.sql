-- Dead-letter a message. A message dead-lettered again after a replay updates its row, and waits
-- again even if it had been archived: a new failure deserves eyes.
-- $1 consumer, $2 topic, $3 message id, $4 payload, $5 metadata, $6 reason, $7 deliveries, $8 now,
-- $9 partition key, $10 event type, $11 failure group, $12 source seq (from the metadata, in Go).
INSERT INTO {{schema}}.dead_letters
    (consumer, topic, message_id, payload, metadata, reason, deliveries, dead_lettered_at,
     partition_key, event_type, failure_group, source_seq)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (consumer, message_id) WHERE message_id <> ''
DO UPDATE SET topic = excluded.topic, payload = excluded.payload, metadata = excluded.metadata,
              reason = excluded.reason, deliveries = excluded.deliveries,
              dead_lettered_at = excluded.dead_lettered_at, replayed_at = NULL, archived_at = NULL,
              partition_key = excluded.partition_key, event_type = excluded.event_type,
              failure_group = excluded.failure_group, source_seq = excluded.source_seq
