-- Records a failed attempt of a row that backs off, as the polling relay's mark_failed does, so
-- that the console shows it and a relay starting again resumes its count.
-- ?1 attempts, ?2 the last error, ?3 the next attempt (UTC), ?4 seq.
UPDATE {{schema}}.outbox SET attempts = ?, last_error = ?, next_attempt_at = ?
WHERE seq = ? AND published_at IS NULL AND dead_lettered_at IS NULL
