-- ?1 consumer, ?2 partition key, ?3 version, ?4 now.
INSERT INTO {{schema}}.inbox_versions (consumer, partition_key, version, updated_at)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (consumer, partition_key) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at
