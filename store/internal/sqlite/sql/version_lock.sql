-- The last version applied for a key (the inbox transaction holds SQLite's write lock).
-- ?1 consumer, ?2 partition key.
SELECT version FROM {{schema}}.inbox_versions WHERE consumer = ?1 AND partition_key = ?2
