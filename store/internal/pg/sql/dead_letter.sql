-- Dead-letter a message. A message dead-lettered again after a replay updates its row.
-- $1 consumer, $2 topic, $3 message id, $4 payload, $5 metadata, $6 reason, $7 deliveries, $8 now.
INSERT INTO {{schema}}.dead_letters
    (consumer, topic, message_id, payload, metadata, reason, deliveries, dead_lettered_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8)
ON CONFLICT (consumer, message_id) WHERE message_id <> ''
DO UPDATE SET topic = excluded.topic, payload = excluded.payload, metadata = excluded.metadata,
              reason = excluded.reason, deliveries = excluded.deliveries,
              dead_lettered_at = excluded.dead_lettered_at, replayed_at = NULL
