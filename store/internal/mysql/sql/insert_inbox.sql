-- The inbox row goes first: a concurrent delivery of the same message blocks on it and then finds
-- the conflict. 1 row affected when inserted, 0 when it exists (the no-op update changes nothing;
-- the connection must not set clientFoundRows). ?1 consumer, ?2 message id, ?3 now.
INSERT INTO {{schema}}.inbox (consumer, message_id, processed_at)
VALUES (?1, ?2, ?3)
ON DUPLICATE KEY UPDATE message_id = message_id
