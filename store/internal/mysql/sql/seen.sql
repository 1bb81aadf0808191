-- ?1 consumer, ?2 message id.
SELECT EXISTS (SELECT 1 FROM {{schema}}.inbox WHERE consumer = ?1 AND message_id = ?2)
