-- ?1 consumer, ?2 partition key, ?3 version.
DELETE FROM {{schema}}.inbox_parked WHERE consumer = ?1 AND partition_key = ?2 AND version = ?3
