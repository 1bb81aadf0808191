-- Lock the message (see lock_count_delivery.sql) and read the count of a delivery counted already,
-- tried again in-process. $1 consumer, $2 message id.
WITH locked AS (SELECT pg_advisory_lock(hashtextextended($1 || chr(31) || $2, 0)))
SELECT coalesce((SELECT deliveries FROM {{schema}}.inbox_deliveries WHERE consumer = $1 AND message_id = $2), 1)
FROM locked
