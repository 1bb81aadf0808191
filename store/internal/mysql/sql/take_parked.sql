-- The message parked for a key's version, locked (then deleted by delete_parked.sql): a locking
-- read sees what committed last. ?1 consumer, ?2 partition key, ?3 version.
SELECT message_id, topic, payload, metadata, parked_at FROM {{schema}}.inbox_parked
WHERE consumer = ?1 AND partition_key = ?2 AND version = ?3 FOR UPDATE
