-- The rows backing off (a failed attempt recorded, neither published nor dead-lettered), through
-- outbox_backing_off_idx: a relay starting again takes their attempts and next attempt from here
-- when the log brings them again.
SELECT seq, attempts, next_attempt_at FROM {{schema}}.outbox
WHERE next_attempt_at IS NOT NULL AND dead_lettered_at IS NULL AND published_at IS NULL
