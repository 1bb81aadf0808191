-- ?1 publication time, ?2 seqs.
UPDATE {{schema}}.outbox SET published_at = ?1, next_attempt_at = NULL WHERE seq IN (?2)
