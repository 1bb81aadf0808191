-- Record message-specific failures in one statement. Per row: the error, when to try again, and,
-- once MaxAttempts is reached, when it was dead-lettered (then next_attempt_at is NULL).
-- The rows are ones this pass claimed: pending, found through the pending index.
-- $1 the rows, a JSON array of {seq, last_error, next_attempt_at, dead_lettered_at}.
UPDATE {{schema}}.outbox AS o
SET attempts         = o.attempts + 1,
    last_error       = f.last_error,
    next_attempt_at  = f.next_attempt_at,
    dead_lettered_at = f.dead_lettered_at
FROM json_to_recordset($1::json)
    AS f(seq bigint, last_error text, next_attempt_at timestamptz, dead_lettered_at timestamptz)
WHERE o.seq = f.seq
  AND o.published_at IS NULL
  AND o.dead_lettered_at IS NULL
