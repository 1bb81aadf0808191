-- Count one delivery (count_delivery_read.sql reads the count). ?4 is the count of a message seen
-- here for the first time. ?1 consumer, ?2 message id, ?3 now, ?4 first count.
INSERT INTO {{schema}}.inbox_deliveries (consumer, message_id, deliveries, first_seen_at, last_seen_at)
VALUES (?1, ?2, ?4, ?3, ?3)
ON DUPLICATE KEY UPDATE deliveries = deliveries + 1, last_seen_at = VALUES(last_seen_at)
