-- The last version applied for a key, locked for the rest of the inbox transaction.
-- ?1 consumer, ?2 partition key.
SELECT version FROM {{schema}}.inbox_versions WHERE consumer = ?1 AND partition_key = ?2 FOR UPDATE
