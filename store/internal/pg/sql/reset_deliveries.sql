-- Forget a message's deliveries before it is replayed, so that it is not dead-lettered again on
-- arrival for having been delivered too often. $1 consumer, $2 message id.
DELETE FROM {{schema}}.inbox_deliveries WHERE consumer = $1 AND message_id = $2
