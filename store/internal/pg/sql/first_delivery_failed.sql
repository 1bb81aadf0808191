-- A first delivery that was not counted failed: count it now, with its error, so that the
-- redelivery counts on from it. Asynchronous commit, as count_delivery.sql.
-- $1 consumer, $2 message id, $3 now, $4 error text.
INSERT INTO {{schema}}.inbox_deliveries AS d (consumer, message_id, deliveries, first_seen_at, last_seen_at, last_error)
SELECT $1, $2, 1, $3, $3, $4
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (consumer, message_id)
DO UPDATE SET deliveries = d.deliveries + 1, last_seen_at = excluded.last_seen_at, last_error = excluded.last_error
