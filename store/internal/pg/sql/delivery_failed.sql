-- $1 consumer, $2 message id, $3 error text.
UPDATE {{schema}}.inbox_deliveries
SET last_error = $3
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE consumer = $1 AND message_id = $2
