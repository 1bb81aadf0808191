-- A key never seen gets a row at version 0 first (the inbox transaction holds SQLite's write lock
-- already; the row keeps LockVersion the same on every store). ?1 consumer, ?2 partition key, ?3 now.
INSERT INTO {{schema}}.inbox_versions (consumer, partition_key, version, updated_at) VALUES (?1, ?2, 0, ?3)
ON CONFLICT (consumer, partition_key) DO NOTHING
