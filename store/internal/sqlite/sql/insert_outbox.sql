-- The outbox rows of a Publish call; the dialect writes a VALUES tuple per message:
-- (uuid, topic, partition key or NULL, payload, metadata, created_at).
INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata, created_at) VALUES
