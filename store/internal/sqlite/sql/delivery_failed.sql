-- ?1 consumer, ?2 message id, ?3 error text.
UPDATE {{schema}}.inbox_deliveries SET last_error = ?3 WHERE consumer = ?1 AND message_id = ?2
