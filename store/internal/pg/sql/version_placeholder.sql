-- A key never seen gets a row at version 0 first, so that LockVersion has a row to lock: two
-- deliveries of one new key (one parking, one applying) are then judged one after the other.
-- $1 consumer, $2 partition key, $3 now.
INSERT INTO {{schema}}.inbox_versions (consumer, partition_key, version, updated_at)
VALUES ($1, $2, 0, $3)
ON CONFLICT (consumer, partition_key) DO NOTHING
