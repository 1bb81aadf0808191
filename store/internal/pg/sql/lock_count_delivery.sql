-- Lock the message and count its delivery, in one round trip. The lock is a session-level
-- advisory lock, held on the delivery's connection until it is done and released by Postgres if
-- the process dies; the count's row comes from the lock, so it is written only once the lock is
-- held. set_config(…, true) makes this statement's commit asynchronous: the count survives any
-- crash of the application (the case it exists for) without waiting for a disk flush; only a crash
-- of Postgres itself could lose the last increments, which delays a dead-letter by a delivery.
-- $4 is the count of a message seen here for the first time: 1, or 2 on a redelivery whose first
-- delivery was not counted.
-- $1 consumer, $2 message id, $3 now, $4 first count.
WITH locked AS (SELECT pg_advisory_lock(hashtextextended($1 || chr(31) || $2, 0)))
INSERT INTO {{schema}}.inbox_deliveries AS d (consumer, message_id, deliveries, first_seen_at, last_seen_at)
SELECT $1, $2, $4::integer, $3, $3
FROM locked, (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (consumer, message_id)
DO UPDATE SET deliveries = d.deliveries + 1, last_seen_at = excluded.last_seen_at
RETURNING deliveries
