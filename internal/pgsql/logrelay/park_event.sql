-- Writes an event of the log parked behind its key's dead letter as an outbox row waiting to be
-- published.
-- $1 uuid, $2 uuid_text, $3 topic, $4 partition key, $5 payload, $6 metadata, $7 created at.
INSERT INTO {{schema}}.outbox (uuid, uuid_text, topic, partition_key, payload, metadata, created_at)
VALUES ($1::uuid, $2, $3, $4, $5, $6, $7) ON CONFLICT (uuid) DO NOTHING
