-- Record message-specific failures in one statement. ?1 the rows, a JSON array of {seq,
-- last_error, next_attempt_at, dead_lettered_at} (times as stored, or null); ?2 lease owner.
UPDATE {{schema}}.outbox
SET attempts         = attempts + 1,
    last_error       = f.last_error,
    next_attempt_at  = f.next_attempt_at,
    dead_lettered_at = f.dead_lettered_at,
    lease_owner      = NULL,
    lease_until      = NULL
FROM (
    SELECT json_extract(value, '$.seq') AS seq,
           json_extract(value, '$.last_error') AS last_error,
           json_extract(value, '$.next_attempt_at') AS next_attempt_at,
           json_extract(value, '$.dead_lettered_at') AS dead_lettered_at
    FROM json_each(?1)
) AS f
WHERE outbox.seq = f.seq AND outbox.lease_owner = ?2
