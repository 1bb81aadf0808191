-- A first delivery that was not counted failed: count it now, with its error.
-- ?1 consumer, ?2 message id, ?3 now, ?4 error text.
INSERT INTO {{schema}}.inbox_deliveries (consumer, message_id, deliveries, first_seen_at, last_seen_at, last_error)
VALUES (?1, ?2, 1, ?3, ?3, ?4)
ON CONFLICT (consumer, message_id)
DO UPDATE SET deliveries = deliveries + 1, last_seen_at = excluded.last_seen_at, last_error = excluded.last_error
