-- ?1 consumer, ?2 partition key, ?3 version, ?4 message id, ?5 topic, ?6 payload, ?7 metadata, ?8 now.
INSERT INTO {{schema}}.inbox_parked (consumer, partition_key, version, message_id, topic, payload, metadata, parked_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (consumer, partition_key, version) DO NOTHING
