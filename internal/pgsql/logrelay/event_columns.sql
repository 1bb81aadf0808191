-- The columns an event is read back from the table with, in the order the relay scans them.
uuid::text, uuid_text, seq, topic, coalesce(partition_key, ''), payload, metadata, created_at
