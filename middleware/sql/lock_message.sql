-- Serialize the deliveries of one message to one consumer: a session-level advisory lock, held on
-- the delivery's connection until it is done, and released by Postgres if the process dies.
-- $1 consumer, $2 message id.
SELECT pg_advisory_lock(hashtextextended($1 || chr(31) || $2, 0))
