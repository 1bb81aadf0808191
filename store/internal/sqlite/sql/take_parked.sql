-- The message parked for a key's version (then deleted by delete_parked.sql; the inbox
-- transaction holds SQLite's write lock). ?1 consumer, ?2 partition key, ?3 version.
SELECT message_id, topic, payload, metadata, parked_at FROM {{schema}}.inbox_parked
WHERE consumer = ?1 AND partition_key = ?2 AND version = ?3
