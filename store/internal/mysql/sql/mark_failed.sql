-- One failed row: attempts+1, the error, and when to try again or when it was dead-lettered.
-- ?1 seq, ?2 error, ?3 next attempt (NULL when dead-lettered), ?4 dead-lettered at (or NULL).
UPDATE {{schema}}.outbox
SET attempts = attempts + 1, last_error = ?2, next_attempt_at = ?3, dead_lettered_at = ?4
WHERE seq = ?1
