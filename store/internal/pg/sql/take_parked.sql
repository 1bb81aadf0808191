-- The message parked for a key's version, removed. $1 consumer, $2 partition key, $3 version.
DELETE FROM {{schema}}.inbox_parked WHERE consumer = $1 AND partition_key = $2 AND version = $3
RETURNING message_id, topic, payload, metadata::text, parked_at
