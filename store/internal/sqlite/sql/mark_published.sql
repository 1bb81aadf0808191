-- ?1 publication time, ?2 seqs, ?3 the lease's owner: a row whose lease another relay has taken
-- since is left to it (it is published again: a duplicate, never a loss).
UPDATE {{schema}}.outbox
SET published_at = ?1, next_attempt_at = NULL, lease_owner = NULL, lease_until = NULL
WHERE seq IN (?2) AND lease_owner = ?3
