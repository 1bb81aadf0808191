-- $1 consumer, $2 message id.
SELECT pg_advisory_unlock(hashtextextended($1 || chr(31) || $2, 0))
