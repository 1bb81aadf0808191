-- Record message-specific failures in one statement. Per row: the error, when to try again, and,
-- once MaxAttempts is reached, when it was dead-lettered (then next_attempt_at is NULL).
UPDATE {{schema}}.outbox AS o
SET attempts         = o.attempts + 1,
    last_error       = f.last_error,
    next_attempt_at  = f.next_attempt_at,
    dead_lettered_at = f.dead_lettered_at
FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::timestamptz[])
    AS f(seq, last_error, next_attempt_at, dead_lettered_at)
WHERE o.seq = f.seq
