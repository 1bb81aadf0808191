-- The inbox row goes first: a concurrent delivery of the same message waits for the write lock and
-- then finds the conflict. ?1 consumer, ?2 message id, ?3 now.
INSERT INTO {{schema}}.inbox (consumer, message_id, processed_at)
VALUES (?1, ?2, ?3)
ON CONFLICT (consumer, message_id) DO NOTHING
