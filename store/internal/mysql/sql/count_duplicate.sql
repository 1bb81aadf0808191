-- ?1 consumer, ?2 message id.
UPDATE {{schema}}.inbox SET duplicates = duplicates + 1 WHERE consumer = ?1 AND message_id = ?2
