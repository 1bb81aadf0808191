-- Count one delivery, in its own transaction. set_config(…, true) makes this transaction's commit
-- asynchronous: the count survives any crash of the application (the case it exists for) without
-- waiting for a disk flush; only a crash of Postgres itself could lose the last increments, which
-- delays a quarantine by a delivery.
-- $4 is the count of a message seen here for the first time: 1, or 2 on a redelivery whose first
-- delivery was not counted (the broker vouched it was a first delivery, and it did not fail).
-- $1 consumer, $2 message id, $3 now, $4 first count.
INSERT INTO {{schema}}.inbox_deliveries AS d (consumer, message_id, deliveries, first_seen_at, last_seen_at)
SELECT $1, $2, $4::integer, $3, $3
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (consumer, message_id)
DO UPDATE SET deliveries = d.deliveries + 1, last_seen_at = excluded.last_seen_at
RETURNING deliveries
