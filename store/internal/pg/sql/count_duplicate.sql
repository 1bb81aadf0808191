-- Count a duplicate on the message's inbox row, committed asynchronously (a lost count is only a
-- statistic). $1 consumer, $2 message id.
UPDATE {{schema}}.inbox
SET duplicates = duplicates + 1
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE consumer = $1 AND message_id = $2
