-- Writes an event of the log as a dead-lettered outbox row (which the relay, reading it back, skips).
-- $1 uuid, $2 uuid_text, $3 topic, $4 partition key, $5 payload, $6 metadata, $7 created at,
-- $8 attempts, $9 the last error, $10 the time.
INSERT INTO {{schema}}.outbox (uuid, uuid_text, topic, partition_key, payload, metadata, created_at,
    attempts, last_error, dead_lettered_at) VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (uuid) DO NOTHING
