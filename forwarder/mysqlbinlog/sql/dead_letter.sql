-- Dead-letters a row the relay read, in the checkpoint's transaction that moves past it, as the
-- polling relay's mark_failed does. ?1 attempts, ?2 the last error, ?3 the time (UTC), ?4 seq.
UPDATE {{schema}}.outbox SET attempts = ?, last_error = ?, next_attempt_at = NULL, dead_lettered_at = ?
WHERE seq = ? AND published_at IS NULL AND dead_lettered_at IS NULL
